"""Generated sections for docs/benchmarks.md beyond the paper's: the tool-call parse rate (from
constraint.py's results), the team runner against mlx_lm.server, the long-window RoPE
stretches, and an index of the diagnostic benchmarks (each one's newest run and command; their
analyses are in docs/benchmarks-log.md).

Same contract as sections_engine: result files in, a Section out.
"""

from __future__ import annotations

import ast
import re

from paper.markdown import Section, not_measured, table
from paper.results import DEVICE_LABEL, REPO, Result, fmt_range, newest_by, of, source_line

TEAM_PEERS = {"locals": "locals", "mlx_lm": "mlx_lm.server"}
# constraint.py's record of the tool-call parse rate, and the command that measures it alone.
PARSE_KEY = "tool_call_parse"
PARSE_COMMAND = "python benchmarks/constraint.py --parse-only"


def newest_parse_rate(results: list[Result], device: str | None = None) -> Result | None:
    files = [f for f in of(results, "constraint", device) if PARSE_KEY in f.data]
    return files[-1] if files else None


def tool_call_parse(results: list[Result]) -> Section:
    """The parse rate per machine: replies whose call the server's parser reads, constrained or not."""
    sec, body = Section(PARSE_KEY), []
    for device in ("gpu", "cpu"):
        f = newest_parse_rate(results, device)
        if f is None:
            continue
        sec.use([f])
        p = f.data[PARSE_KEY]
        body.append([DEVICE_LABEL[device], str(f.data.get("model")), str(p["requests"]),
                     f"{p['constrained'] * 100:.0f}%", f"{p['free'] * 100:.0f}%", f"`{f.name}`"])
    if not body:
        sec.parts.append(f"*Tool-call parse rate: not measured yet* (no constraint result records it; "
                         f"`{PARSE_COMMAND}` measures it).")
        return sec
    sec.parts += [
        f"**Table: tool-call parse rate** — replies to coding requests offered {p['tools']} tools, sampled at "
        f"temperature {p['temperature']} with up to {p['max_tokens']} tokens, whose call of an offered tool with "
        "its required arguments the server's parser reads: constrained (`tool_choice` \"required\", as locals "
        "serves it) and not (the same engine and prompts, as a server without the constraint decodes).",
        table(["machine", "model", "replies per mode", "constrained", "no constraint", "file"], body),
        source_line(sec.files)]
    return sec


def team_run(results: list[Result]) -> Section:
    sec, body = Section("team_run"), []
    files = of(results, "team_run")[-1:]
    if not files:
        sec.parts.append(not_measured("team_run", "cpu", "python benchmarks/team_run.py --agents 1,4"))
        return sec
    f = files[0]
    sec.use(files)
    for peer, label in TEAM_PEERS.items():
        for n, row in (f.data.get("table", {}).get(peer) or {}).items():
            body.append([n, label, fmt_range(row.get("wall_s")), fmt_range(row.get("completion_tokens"), 0),
                         str(row.get("passed", "–"))])
    args = f.data.get("args", {})
    sec.parts += [
        f"**Table: a team of agents on one task, {f.label}** — `locals run` "
        f"on \"{f.data.get('task')}\" with the check `{f.data.get('check')}`, served by each server in turn; "
        f"{args.get('rounds')} round(s), up to {args.get('max_steps')} steps an agent and "
        f"{args.get('max_tokens')} tokens a reply; median (range) over rounds.",
        table(["agents", "server", "wall time, s", "completion tokens", "runs passing the check"], body),
        source_line(files)]
    return sec


def _window_cell(run: dict) -> str:
    s = run["summary"]
    return f"{s['hits']}/{s['needles']} · {s['ppl']:.2f}"


def _verdict(f: Result, scaling: str, window: int) -> str:
    for v in f.data.get("verdicts", []):
        if v["scaling"] == scaling and v["window"] == window:
            failed = [check for check, ok in v["checks"].items() if not ok]
            return "passed" if v["passed"] else "failed: " + ", ".join(failed)
    return "–"


def _window_table(f: Result) -> list[str]:
    runs = f.data["runs"]
    lengths = sorted({r["length"] for r in runs})
    body = []
    for scaling, window in dict.fromkeys((r["scaling"], r["window"]) for r in runs):
        at = {r["length"]: r for r in runs if (r["scaling"], r["window"]) == (scaling, window)}
        body.append([scaling, str(window), *[_window_cell(at[n]) if n in at else "" for n in lengths],
                     "(the baseline)" if scaling == "none" else _verdict(f, scaling, window)])
    return [
        f"**Table: RoPE stretches of the embedded SmolLM2-135M ({f.data.get('trained')}-token window), "
        f"{f.label}** — {f.data.get('samples')} samples of {f.data.get('text')} at each length; "
        "each cell: needles found / hidden, then the text's perplexity; a stretch to window W is measured at "
        "every length up to W.",
        table(["scaling", "window", *[f"{n} tokens" for n in lengths], "verdict"], body),
        source_line([f])]


def long_window(results: list[Result]) -> Section:
    sec = Section("long_window")
    for device in ("gpu", "cpu"):
        files = of(results, "long_window", device)[-1:]
        if not files:
            sec.parts.append(not_measured("long_window", device, "python benchmarks/long_window.py"))
            continue
        sec.use(files)
        sec.parts += _window_table(files[0])
    return sec


def _purpose(benchmark: str) -> str:
    """What a diagnostic measures: its script docstring's opening words, up to the first
    parenthesis, colon or full stop."""
    path = REPO / "benchmarks" / f"{benchmark}.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) if path.is_file() else None
    if not doc:
        return "–"
    first = " ".join(doc.split("\n\n")[0].split())
    return re.split(r" \(|: |\. ", first)[0].rstrip(".")


def diagnostics(results: list[Result], shown: set[str]) -> Section:
    """Each other benchmark's newest run per machine: what it measures, when, and its command."""
    sec, body = Section("diagnostics"), []
    others = [r for r in results if r.benchmark not in shown and (REPO / "benchmarks" / f"{r.benchmark}.py").is_file()]
    for f in sorted(newest_by(others, lambda r: (r.benchmark, r.device)), key=lambda r: (r.benchmark, r.device)):
        sec.use([f])
        body.append([f"`{f.benchmark}`", _purpose(f.benchmark), f.label, f.date,
                     f"`{f.command()}`"])
    if body:
        sec.parts.append(table(["benchmark", "what it measures", "machine", "newest run", "command"], body))
    return sec
