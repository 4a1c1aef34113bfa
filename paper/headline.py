"""The README's headline table: served throughput and TTFT against mlx_lm.server (and llama.cpp's
server where a report measured it) on named machines, the tool-call parse rate, and next-turn and
after-restart TTFT — each a median from the newest result file, with the command that wrote it
and a link to its section of docs/benchmarks.md. A figure with no result file says "not measured
yet" and names the command that would measure it.
"""

from __future__ import annotations

from collections.abc import Callable

from locals.traffic.report import rounds_done, rounds_text
from paper.markdown import table
from paper.results import DEVICE_LABEL, Result, fmt, med, of
from paper.sections_runs import PARSE_COMMAND, PARSE_KEY, newest_parse_rate
from paper.sections_served import HOW, headline, model_label, newest_served, ratio_text

OURS, PEER, LLAMA = "locals", "mlx_lm.server", "llama.cpp"
NOT_MEASURED = "not measured yet"
# The served figures the README names: (device, model as the report records it).
SERVED = (("gpu", "qwen3-4b"), ("cpu", "smollm2"))
# agent_turns.py calls mlx_lm.server "mlx_lm".
AGENT_PEER = "mlx_lm"

Link = Callable[[str], str]  # section name -> a Markdown link to it


def _ratio(ours: float | None, theirs: float | None) -> str:
    return ratio_text(None if ours is None or not theirs else ours / theirs)


def _row(figure: str, machine: str, values: dict[str, str], rate: str, command: str, link: str,
         llama: bool) -> list[str]:
    cells = [values.get(OURS, "–"), values.get(PEER, "–")] + ([values.get(LLAMA, "–")] if llama else [])
    return [figure, machine, *cells, rate, f"`{command}` · {link}"]


def _served_rows(results: list[Result], link: Link, llama: bool) -> list[list[str]]:
    rows = []
    for device, model in SERVED:
        f = newest_served(results, device, model)
        machine = f"{f.label if f else DEVICE_LABEL[device]}, {model_label(model)}"
        if f is None:
            rows.append(_row("served output tok/s and TTFT", machine, {OURS: NOT_MEASURED}, "–", HOW[device],
                             link("served_traffic"), llama))
            continue
        for key, figure, unit, digits in (("output_tps", "served output", "tok/s", 1),
                                          ("ttft_p50_s", "served TTFT p50", "s", 2)):
            n, values = headline(f, key)
            short = f", {rounds_text(f.data)}" if rounds_done(f.data) < f.data.get("rounds", 0) else ""
            rows.append(_row(f"{figure}, {n} agent{'s' if n > 1 else ''}{short}, {unit}", machine,
                             {s: fmt(v, digits) for s, v in values.items()}, _ratio(values.get(OURS), values.get(PEER)),
                             f.command(), link("served_traffic"), llama))
    return rows


def _parse_rows(results: list[Result], link: Link, llama: bool) -> list[list[str]]:
    """The share of replies to requests offered tools whose call parses: constrained (as locals
    serves it) and not (the same engine and weights, as a server without the constraint decodes)."""
    f = newest_parse_rate(results)
    if f is None:
        return [_row("tool-call parse rate", f"{DEVICE_LABEL['cpu']}, {model_label('smollm2')}",
                     {OURS: NOT_MEASURED}, "–", PARSE_COMMAND, link("constraint"), llama)]
    rates = f.data[PARSE_KEY]
    return [_row(f"tool-call parse rate, {rates['requests']} replies", f"{f.label}, "
                 f"{model_label(str(f.data.get('model')))}", {OURS: f"{rates['constrained'] * 100:.0f}%",
                                                              PEER: f"{rates['free'] * 100:.0f}% (no constraint)"},
                 "–", f.command(), link("constraint"), llama)]


def _turn_rows(results: list[Result], link: Link, llama: bool) -> list[list[str]]:
    rows = []
    for key, figure in (("later_turns_ttft_s", "next-turn TTFT, s"),
                        ("after_restart_ttft_s", "TTFT after a restart, s")):
        for device in ("gpu", "cpu"):
            files = of(results, "agent_turns", device)[-1:]
            if not files:
                rows.append(_row(figure, DEVICE_LABEL[device], {OURS: NOT_MEASURED}, "–",
                                 "python benchmarks/agent_turns.py", link("agent_turns"), llama))
                continue
            f = files[0]
            model = (f.data.get("args") or {}).get("random_model") or "smollm2"
            table_ = f.data.get("table", {})
            values = {OURS: med((table_.get(OURS) or {}).get(key)), PEER: med((table_.get(AGENT_PEER) or {}).get(key))}
            rows.append(_row(figure, f"{DEVICE_LABEL[device]}, {model_label(model)}",
                             {s: fmt(v, 2) for s, v in values.items()}, _ratio(values[OURS], values[PEER]),
                             f.command(), link("agent_turns"), llama))
    return rows


def headline_table(results: list[Result], link: Link) -> str:
    """The README's table; a llama.cpp column only once a served report measured it."""
    llama = any(LLAMA in f.data.get("summary", {}) for f in of(results, "serve_traffic"))
    header = ["figure", "machine, model", OURS, PEER] + ([LLAMA] if llama else []) + [
        f"{OURS} / {PEER}", "command · details"]
    rows = (_served_rows(results, link, llama) + _parse_rows(results, link, llama)
            + _turn_rows(results, link, llama))
    note = ("" if llama else "\n\nllama.cpp's server: not measured yet (`locals bench` runs it beside the others "
            "when the model is a GGUF and `llama-cpp-python[server]` is installed).")
    return table(header, rows) + note
