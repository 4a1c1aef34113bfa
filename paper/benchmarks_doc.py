"""docs/benchmarks.md and README.md's headline table, generated from the newest files in
benchmarks/results/ (the paper's sections, less their figures, plus served traffic, the team
runner, the long window and an index of the diagnostics).

    python paper/benchmarks_doc.py            # rewrites docs/benchmarks.md and README.md's table
    python paper/benchmarks_doc.py --check    # exits 1 when either differs from what the results give

README.md's table sits between `<!-- headline: … -->` and `<!-- end headline -->`; the rest of
the README is left as it is. tests/repo/test_benchmarks_doc.py fails when the committed files differ
from what this renders, so they cannot drift from the results.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from paper import page_text  # noqa: E402
from paper.headline import headline_table  # noqa: E402
from paper.markdown import Section  # noqa: E402
from paper.results import REPO, RESULTS, Result, load_results  # noqa: E402
from paper.sections_engine import batch_decode, long_prompt, rewrite  # noqa: E402
from paper.sections_more import agent_turns, constraint, kernels  # noqa: E402
from paper.sections_runs import diagnostics, long_window, team_run, tool_call_parse  # noqa: E402
from paper.sections_served import served_traffic  # noqa: E402

PAGE = REPO / "docs" / "benchmarks.md"
README = REPO / "README.md"
HEADLINE = re.compile(r"(<!-- headline: [^\n]*-->\n)(.*?)(<!-- end headline -->)", re.S)
COMMAND = "python paper/benchmarks_doc.py"


@dataclass(frozen=True)
class Part:
    """One section of the page: its name (the key of its intro in page_text), its heading, and
    what renders its tables from the result files."""

    name: str
    heading: str
    render: Callable[[list[Result]], Section]


def _paper(fn) -> Callable[[list[Result]], Section]:
    """A paper section without its figures (they are drawn for the paper, in paper/generated/)."""
    def render(results: list[Result]) -> Section:
        sec = fn(results, "")
        sec.parts = [p for p in sec.parts if not p.startswith(("![", "*Figure:"))]
        return sec
    return render


def _joined(*renders: Callable[[list[Result]], Section]) -> Callable[[list[Result]], Section]:
    """Several renderings as one section: their parts in order, their files together."""
    def render(results: list[Result]) -> Section:
        out = Section("joined")
        for sec in (r(results) for r in renders):
            out.parts += sec.parts
            out.use(sec.files)
        return out
    return render


PARTS = (
    Part("served_traffic", "Served traffic", served_traffic),
    Part("batch_decode", "Batch decode (in-process, a diagnostic)", _paper(batch_decode)),
    Part("long_prompt", "A long prompt while streams decode (in-process)", _paper(long_prompt)),
    Part("rewrite", "Prompt-lookup drafts (in-process)", _paper(rewrite)),
    Part("constraint", "Constrained decoding", _joined(tool_call_parse, _paper(constraint))),
    Part("agent_turns", "Agent turns: the next turn, a restart, agents at once", _paper(agent_turns)),
    Part("team_run", "Team runner", team_run),
    Part("kernels", "Small-batch kernels", _paper(kernels)),
    Part("long_window", "Long window: RoPE stretches", long_window),
)
DIAGNOSTICS = "diagnostics"
HEADINGS = {**{p.name: p.heading for p in PARTS}, DIAGNOSTICS: "Other measurements (diagnostics)"}


def anchor(heading: str) -> str:
    """The fragment GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _runs_line(files: list[Result]) -> str:
    by_device: dict[str, list[str]] = {}
    for f in sorted(files, key=lambda r: r.stamp, reverse=True):
        by_device.setdefault(f.label, []).append(f.date)
    return "Runs: " + "; ".join(f"{device}, {', '.join(dates)}" for device, dates in by_device.items()) + "."


def render_page(results: list[Result]) -> str:
    """docs/benchmarks.md for these result files."""
    out = [page_text.TOP.format(command=COMMAND), "Contents: " + " · ".join(
        f"[{heading}](#{anchor(heading)})" for heading in HEADINGS.values()) + "."]
    shown = {p.name for p in PARTS}
    for part in PARTS:
        sec = part.render(results)
        out += [f"## {part.heading}", page_text.INTRO[part.name]]
        if sec.files:
            out.append(_runs_line(sec.files))
        out += sec.parts
        shown |= {f.benchmark for f in sec.files}
    index = diagnostics(results, shown)
    out += [f"## {HEADINGS[DIAGNOSTICS]}", page_text.INTRO[DIAGNOSTICS], *index.parts]
    return "\n\n".join(out) + "\n"


def render_headline(results: list[Result]) -> str:
    """The README's headline table, its links pointing into docs/benchmarks.md."""
    def link(name: str) -> str:
        return f"[details](docs/benchmarks.md#{anchor(HEADINGS[name])})"
    return headline_table(results, link) + "\n"


def splice_readme(text: str, table: str) -> str:
    if not HEADLINE.search(text):
        raise SystemExit("README.md has no `<!-- headline: … -->` … `<!-- end headline -->` block to fill")
    return HEADLINE.sub(lambda m: m[1] + table + m[3], text, count=1)


def rendered(results_dir: Path = RESULTS) -> dict[Path, str]:
    """{file: what it should hold} for docs/benchmarks.md and README.md."""
    results = load_results(results_dir)
    return {PAGE: render_page(results), README: splice_readme(README.read_text(), render_headline(results))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of benchmark JSON files")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is out of date")
    args = ap.parse_args(argv)
    if not args.results.is_dir():
        raise SystemExit(f"no results folder at {args.results}; pass --results DIR")
    stale = []
    for path, text in rendered(args.results).items():
        if path.read_text() == text:
            continue
        stale.append(path.relative_to(REPO).as_posix())
        if not args.check:
            path.write_text(text)
            print("rewrote", path.relative_to(REPO))
    if args.check and stale:
        raise SystemExit(f"out of date with benchmarks/results/: {', '.join(stale)}; run {COMMAND}")
    if not stale:
        print("up to date:", ", ".join(p.relative_to(REPO).as_posix() for p in (PAGE, README)))


if __name__ == "__main__":
    main()
