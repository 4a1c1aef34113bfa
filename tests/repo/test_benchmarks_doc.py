"""docs/benchmarks.md and README.md's headline table are what paper/benchmarks_doc.py renders
from benchmarks/results/ (so they cannot drift from the results); without a result file a
figure says "not measured yet"; a served-traffic report, from benchmarks/serve_traffic.py or
`locals bench`, fills its rows in; and references to named sections of the benchmarks pages,
across the docs and the code, find those sections."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from locals.traffic.report import ratios, summarise
from paper import benchmarks_doc
from paper.results import RESULTS, load_results

from tests.helpers.repo import REPO

LOG = REPO / "docs" / "benchmarks-log.md"
SEARCHED = ("README.md", "CONTRIBUTING.md", "docs", "paper", "locals", "benchmarks", "agents", "integrations", "tests")
# `docs/benchmarks.md, "Heading"` (a comment's `#` may sit inside a wrapped quote).
# `docs/tune.md, "What a tuned table costs"`, the title also on the next comment line.
NAMED = re.compile(r"([\w-]+\.md),\s+(?:#\s*)?\"([^\"]+)\"")
# `docs/benchmarks.md, the seventh set of runs` and `(fourteenth set in docs/benchmarks-log.md)`.
SET_AFTER = re.compile(r"(benchmarks(?:-log)?\.md),\s+(?:the\s+)?(\w+)\s+set\b")
SET_BEFORE = re.compile(r"(\w+)\s+set\s+in\s+(?:docs/)?(benchmarks(?:-log)?\.md)")


def test_committed_docs_are_what_the_results_give():
    for path, text in benchmarks_doc.rendered(RESULTS).items():
        assert path.read_text() == text, (
            f"{path.relative_to(REPO)} differs from what benchmarks/results/ gives: run python paper/benchmarks_doc.py")


def test_page_is_a_short_reference():
    page = (REPO / "docs" / "benchmarks.md").read_text()
    assert len(page.splitlines()) <= 360  # each machine's served table per agent count takes ~20
    assert "set of runs" not in page and "benchmarks-log.md" in page


def test_without_results_every_figure_says_not_measured(tmp_path):
    results = load_results(tmp_path)
    table = benchmarks_doc.render_headline(results)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows and all("not measured yet" in row for row in rows)
    assert not re.search(r"\d+\.\d+", table), "a headline figure without a result file"
    page = benchmarks_doc.render_page(results)
    assert page.count("not measured yet") >= 8
    assert not re.search(r"\d+\.\d+ ?(?:s|ms|tok/s|×)\b", page), "a figure without a result file"


def _served_report(device_backend: str, model: str, command: list[str]) -> dict:
    def phase(tps: float, ttft: float) -> dict:
        return {"figures": {"wait_s": 10.0, "output_tps": tps, "burst_tps": tps * 2, "ttft_p50_s": ttft,
                            "ttft_p99_s": ttft * 3, "gap_p99_ms": 40.0, "gap_max_ms": 90.0, "failed": 0}}
    runs = {"locals": [{"ready_s": 3.0, "first_token_s": 4.0, "phases": {"1": phase(50.0, 0.2), "8": phase(300.0, 0.5)}}
                       for _ in range(2)],
            "mlx_lm.server": [{"ready_s": 2.0, "first_token_s": 5.0, "phases": {"1": phase(40.0, 0.3),
                                                                                 "8": phase(100.0, 2.0)}}
                              for _ in range(2)]}
    summary = summarise(runs, [1, 8])
    return {"benchmark": "serve_traffic", "agents": [1, 8], "rounds": 2, "model": model, "backend": device_backend,
            "command": command, "runs": runs, "summary": summary, "ratios": ratios(summary),
            "failures": {"locals": {"rounds": 0, "1": 0, "8": 0}, "mlx_lm.server": {"rounds": 0, "1": 0, "8": 0}},
            "scaled_workload": {"turns": 2, "system_tokens": [2000, 4000], "turn_tokens": [100, 1500],
                                "reply_tokens": [50, 400], "tool_time_s": [0.0, 1.0], "burst_reply_tokens": 256},
            "machine": {"device_info": {"device_name": "NVIDIA H200"}, "cpu_count": 16, "memory_bytes": 2**37}}


def test_served_reports_fill_in_the_headline_and_the_section(tmp_path):
    (tmp_path / "serve_traffic-gpu-20270101-000000.json").write_text(json.dumps(
        _served_report("cuda", "/tmp/serve-traffic-x/qwen3-4b", ["--quick", "--out", "somewhere/"])))
    (tmp_path / "bench-20270102-000000.json").write_text(json.dumps(
        _served_report("cpu", "smollm2", ["bench", "--agents", "1,8", "--out=somewhere/"])))
    (tmp_path / "bench-20270103-000000.json").write_text(json.dumps({"benchmark": "locals bench --engine"}))
    results = load_results(tmp_path)
    assert [r.name for r in results] == ["serve_traffic-gpu-20270101-000000.json", "bench-20270102-000000.json"]
    table = benchmarks_doc.render_headline(results)
    assert "| served output, 8 agents, tok/s | H200, random-weight Qwen3-4B shape, 4-bit | 300.0 | 100.0 | 3.00× |" in table
    assert "| served TTFT p50, 8 agents, s | CPU (2 shared x86 cores), embedded SmolLM2-135M | 0.50 | 2.00 | 0.25× |" in table
    assert "`python benchmarks/serve_traffic.py --quick`" in table and "`locals bench --agents 1,8`" in table
    assert "somewhere" not in table
    page = benchmarks_doc.render_page(results)
    served = page[page.index("## Served traffic"):page.index("## Batch decode")]
    assert "NVIDIA H200 (16 CPU cores, 128 GiB)" in served and "not measured yet" not in served
    assert "| 8 | wait on server, s | 10.0 | 10.0 | 1.00× |" in served
    assert "|  | output tok/s | 300.0 | 100.0 | 3.00× |" in served
    assert "|  | TTFT p50 / p99, s | 0.50 / 1.50 | 2.00 / 6.00 | 0.25× / 0.25× |" in served


def test_headline_links_point_at_sections_of_the_page():
    readme = (REPO / "README.md").read_text()
    anchors = {benchmarks_doc.anchor(h) for h in re.findall(r"^## (.+)$", (REPO / "docs" / "benchmarks.md").read_text(),
                                                             re.M)}
    links = re.findall(r"\(docs/benchmarks\.md#([\w-]+)\)", readme)
    assert links and set(links) <= anchors


def test_readme_keeps_its_two_set_up_commands():
    readme = (REPO / "README.md").read_text()
    set_up = readme[readme.index("## Set up"):readme.index("\n## ", readme.index("## Set up") + 1)]
    assert len(re.findall(r"^```sh\n[^\n]+\n```", set_up, re.M)) == 2


def _headings(path: Path) -> list[str]:
    return [" ".join(h.replace("`", "").split()).lower() for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)]


def _searched_files() -> list[Path]:
    files = []
    for name in SEARCHED:
        path = REPO / name
        files += [path] if path.is_file() else [p for p in path.rglob("*") if p.suffix in (".md", ".py", ".sh")]
    return [p for p in files if p.name not in ("benchmarks.md", "benchmarks-log.md") and p != Path(__file__).resolve()]


@pytest.mark.parametrize("text, page, found", [
    ('see docs/benchmarks-log.md, "Keys and values written by the\n    # q/k kernel")', "benchmarks-log.md",
     "keys and values written by the q/k kernel"),
    ('(docs/benchmarks-log.md,\n# "Tuning by device time")', "benchmarks-log.md", "tuning by device time"),
    ('(docs/tune.md, "Shipped tables")', "tune.md", "shipped tables"),
    ("(docs/benchmarks.md, the\n   seventh set of runs)", "benchmarks.md", "seventh"),
    ("(fourteenth set in\n  docs/benchmarks-log.md)", "benchmarks-log.md", "fourteenth"),
])
def test_section_references_are_found(text, page, found):
    refs = _references(text)
    assert refs and refs[0][0] == page and refs[0][1] == found


def _references(text: str) -> list[tuple[str, str, str]]:
    """(page, what, kind) for each reference to a named section; kind "heading" or "set"."""
    refs = [(m[1], " ".join(re.sub(r"\n\s*#", " ", m[2]).replace("`", "").split()).lower(), "heading")
            for m in NAMED.finditer(text)]
    refs += [(m[1], m[2].lower(), "set") for m in SET_AFTER.finditer(text)]
    refs += [(m[2], m[1].lower(), "set") for m in SET_BEFORE.finditer(text)]
    return refs


def test_references_to_sections_of_the_docs_find_them():
    headings: dict[str, list[str]] = {}
    for page in (REPO / "docs").rglob("*.md"):  # docs/ and docs/arch/ (cache.md in both: pooled)
        headings.setdefault(page.name, []).extend(_headings(page))
    missing = []
    for path in _searched_files():
        for page, what, kind in _references(path.read_text(errors="replace")):
            if kind == "heading":
                ok = any(h.startswith(what) for h in headings.get(page, []))
            else:
                ok = any(f"{what} set" in h for h in headings[page])
            if not ok:
                missing.append((path.relative_to(REPO).as_posix(), page, what))
    assert not missing, f"references to sections that do not exist: {missing}"


def test_a_served_caption_says_whether_its_rounds_started_cold_or_warm():
    from paper.results import Result
    from paper.sections_served import _kernels

    def said(held):
        return _kernels(Result(Path("r.json"), {"kernel_folders": held}))

    assert said(None) == ""  # a CPU
    assert "was empty at the start" in said({"locals": 0, "mlx_lm.server": 0})
    assert "kept from an earlier run" in said({"locals": 40, "mlx_lm.server": 90})
    mixed = said([{"locals": 0, "mlx_lm.server": 0}, {"locals": 40, "mlx_lm.server": 90}])
    assert mixed == (" Its rounds ran as 2 commands in a row on one machine. CUDA kernel folders at the start: "
                     "locals empty in 1 of 2 commands; mlx_lm.server empty in 1 of 2 commands (cold rounds "
                     "compile their kernels).")
    assert "locals kept from an earlier run; mlx_lm.server empty" in said({"locals": 27, "mlx_lm.server": 0})
