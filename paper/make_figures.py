"""Tables (Markdown) and figures (PNG) for the paper, generated from benchmarks/results/*.json.

    python paper/make_figures.py                       # writes paper/generated/
    python paper/make_figures.py --splice paper/paper.md   # and refreshes the paper's generated blocks

A block in the paper is `<!-- generated:NAME files=A.json,B.json -->` … `<!-- end generated:NAME -->`;
its content is exactly what the section NAME renders from those files, which tests check.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from paper.markdown import Section  # noqa: E402
from paper.results import RESULTS, load_results  # noqa: E402
from paper.sections_engine import batch_decode, long_prompt, rewrite  # noqa: E402
from paper.sections_more import agent_turns, constraint, kernels  # noqa: E402
from paper.sections_served import served_traffic  # noqa: E402

SECTIONS = {"served_traffic": served_traffic, "batch_decode": batch_decode, "long_prompt": long_prompt,
            "rewrite": rewrite, "constraint": constraint, "kernels": kernels, "agent_turns": agent_turns}
PAPER = Path(__file__).resolve().parent / "paper.md"
BLOCK = re.compile(r"<!-- generated:(?P<name>\w+) files=(?P<files>[^ ]*) -->\n(?P<body>.*?)"
                   r"<!-- end generated:(?P=name) -->", re.S)


def render_all(results_dir: Path = RESULTS, prefix: str = "generated/") -> dict[str, Section]:
    """Every section from the newest files in `results_dir`."""
    results = load_results(results_dir)
    return {name: fn(results, prefix) for name, fn in SECTIONS.items()}


def render_from(name: str, files: list[str], results_dir: Path = RESULTS,
                prefix: str = "generated/") -> Section:
    """Section `name` rendered from exactly these result files (what a paper block names)."""
    return SECTIONS[name](load_results(results_dir, files), prefix)


def write(sections: dict[str, Section], out: Path) -> list[Path]:
    """Write each section's Markdown and figures under `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, sec in sections.items():
        path = out / f"{name}.md"
        path.write_text(sec.markdown)
        written.append(path)
        for fig_name, draw in sec.figures.items():
            draw(out / fig_name)
            written.append(out / fig_name)
    return written


def block(sec: Section) -> str:
    files = ",".join(f.name for f in sec.files)
    return f"<!-- generated:{sec.name} files={files} -->\n{sec.markdown}<!-- end generated:{sec.name} -->"


def splice(text: str, sections: dict[str, Section]) -> str:
    """`text` with every generated block replaced by its section's current rendering."""
    def replace(m: re.Match) -> str:
        if m["name"] not in sections:
            raise SystemExit(f"paper block generated:{m['name']} names no section; known: {', '.join(sections)}")
        return block(sections[m["name"]])
    return BLOCK.sub(replace, text)


def blocks(text: str) -> list[tuple[str, list[str], str]]:
    """(name, files, body) of each generated block in a paper's text."""
    return [(m["name"], [f for f in m["files"].split(",") if f], m["body"]) for m in BLOCK.finditer(text)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of benchmark JSON files")
    ap.add_argument("--out", type=Path, default=PAPER.parent / "generated", help="where tables and figures go")
    ap.add_argument("--splice", type=Path, help="a paper whose generated blocks to refresh in place")
    args = ap.parse_args(argv)
    if not args.results.is_dir():
        raise SystemExit(f"no results folder at {args.results}; pass --results DIR")
    sections = render_all(args.results)
    for path in write(sections, args.out):
        print("wrote", path)
    if args.splice:
        args.splice.write_text(splice(args.splice.read_text(), sections))
        print("refreshed", args.splice)


if __name__ == "__main__":
    main()
