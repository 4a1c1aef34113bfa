"""Generated sections for the constraint's cost, the small-batch kernels against
`mx.quantized_matmul`, and agent-like conversations (prefix cache) against mlx_lm.server.

Same contract as sections_engine: result files in, a Section out.
"""

from __future__ import annotations

from functools import partial

from paper import plots
from paper.markdown import Section, figure, not_measured, table
from paper.results import DEVICE_LABEL, Result, fmt, fmt_range, med, of, ratio, source_line

DEVICES = ("gpu", "cpu")
META = {"benchmark", "device", "machine", "mlx", "when", "model", "batch", "argv", "args"}
# Known constraint keys: label, scale, unit. Unknown numeric keys are listed by their own name.
CONSTRAINT_LABELS = {
    "step_s_unconstrained": ("decode step, no row constrained", 1.0, " s"),
    "step_s_constrained": ("decode step, every row constrained", 1.0, " s"),
    "overhead": ("constraint overhead per step", 100.0, "%"),
    "mask_s_per_step": ("mask gather + apply per step", 1000.0, " ms"),
    "jump_forward_share": ("tool-call tokens written by jump-forward", 100.0, "%"),
    "person": ("compile: a 'person' JSON schema", 1.0, " s"),
    "one_tool_args": ("compile: one tool's arguments", 1.0, " s"),
    "one_tool_call_json_tools": ("compile: one tool call, hermes json_tools", 1.0, " s"),
    "one_tool_call_qwen3_coder": ("compile: one tool call, Qwen3-Coder XML", 1.0, " s"),
    "one_tool_call_llama3_json": ("compile: one tool call, llama3_json", 1.0, " s"),
    "first_seen_24_tools": ("first-seen 24-tool set ready", 1.0, " s"),
    "one_tool_call_qwen3_coder_inline": ("compile: one tool call, Qwen3-Coder XML, values inline (before)", 1.0, " s"),
    "all_calls_compiled_24_tools": ("compile: every call of 24 coding tools, hermes", 1.0, " s"),
    "first_seen_24_edit_tools_json_tools": ("first-seen 24 edit tools ready, hermes", 1.0, " s"),
    "all_calls_compiled_24_edit_tools_json_tools": ("compile: every call of 24 edit tools, hermes", 1.0, " s"),
    "first_seen_24_edit_tools_qwen3_coder": ("first-seen 24 edit tools ready, Qwen3-Coder XML", 1.0, " s"),
    "all_calls_compiled_24_edit_tools_qwen3_coder": ("compile: every call of 24 edit tools, Qwen3-Coder XML", 1.0, " s"),
    "engine_s_per_step_free": ("engine: step, no row constrained", 1.0, " s"),
    "engine_s_per_step_constrained": ("engine: step, every row constrained (with jump-forward tokens)", 1.0, " s"),
    "engine_tokens_per_s_free": ("engine: tokens/s, no row constrained", 1.0, " tok/s"),
    "engine_tokens_per_s_constrained": ("engine: tokens/s, every row constrained", 1.0, " tok/s"),
    "engine_step_time_ratio": ("engine: step time, constrained / free", 1.0, "×"),
    "engine_tokens_per_s_ratio": ("engine: tokens/s, constrained / free", 1.0, "×"),
    "engine_s_per_step_auto": ("engine: step, every row offered tools, tool_choice auto", 1.0, " s"),
    "engine_tokens_per_s_auto": ("engine: tokens/s, tool_choice auto", 1.0, " tok/s"),
    "engine_auto_step_time_ratio": ("engine: step time, auto / free", 1.0, "×"),
    "engine_taken_back_tokens": ("engine: draws made ahead then taken back", 1.0, ""),
}


def _metric(key: str, value: float) -> str:
    _, scale, unit = CONSTRAINT_LABELS.get(key, (key, 1.0, ""))
    if key == "engine_taken_back_tokens":
        return f"{int(value):,}"
    digits = 1 if unit in ("%", " ms", " tok/s") else 2 if unit == "×" else 3
    return f"{value * scale:.{digits}f}{unit}"


def _compile_key(key: str) -> str | None:
    """The compile time a transition count belongs to (their cells are shown together)."""
    pairs = (("one_tool_transitions_", "one_tool_call_"), ("all_calls_transitions_", "all_calls_compiled_"))
    for count, compiled in pairs:
        if key.startswith(count):
            return compiled + key[len(count):]
    return None


def _with_transitions(key: str, values: dict) -> str:
    if key not in values:
        return "–"
    count = next((k for k in values if _compile_key(k) == key), None)
    return _metric(key, values[key]) + (f" ({int(values[count]):,} transitions)" if count else "")


def _newest_values(files: list[Result]) -> tuple[dict, list[Result]]:
    """Each measured key's value from the newest file that has it (files oldest first), and the
    files that gave a value: a run that skipped the compile timings keeps the older ones."""
    values, used = {}, []
    for f in reversed(files):
        fresh = {k: v for k, v in f.data.items() if k not in META and k not in values
                 and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if fresh:
            values.update(fresh)
            used.append(f)
    return values, used


def constraint(results: list[Result], prefix: str = "generated/") -> Section:
    sec, found = Section("constraint"), {}
    for device in DEVICES:
        files = of(results, "constraint", device)
        if files:
            found[device], used = _newest_values(files)
            sec.use(used)
        else:
            sec.parts.append(not_measured("constraint", device, "python benchmarks/constraint.py"))
    if not found:
        return sec
    # Keys without a label are the benchmark's own diagnostics (in its JSON, not in this table).
    keys = list(dict.fromkeys(k for values in found.values() for k in values if k in CONSTRAINT_LABELS))
    body = [[CONSTRAINT_LABELS[k][0], *[_with_transitions(k, values) for values in found.values()]] for k in keys]
    first = sec.files[0].data
    sec.parts[:0] = [
        f"**Table: cost of constrained decoding** — {first.get('model')}, B = {first.get('batch')}, "
        "6 coding tools; step rows: every row constrained against none in one run; other rows from "
        "the newest run that measured them.",
        table(["what", *[DEVICE_LABEL[d] for d in found]], body), source_line(sec.files)]
    steps = {DEVICE_LABEL[d]: {"decode step": {"free": v["step_s_unconstrained"] * 1000,
                                               "constrained": v["step_s_constrained"] * 1000,
                                               "mask": v.get("mask_s_per_step", 0.0) * 1000}}
             for d, v in found.items() if "step_s_unconstrained" in v and "step_s_constrained" in v}
    if steps:
        sec.figures["constraint.png"] = partial(plots.grouped_bars, panels=steps, ylabel="ms per step")
        sec.parts.append(figure(prefix, "constraint.png", "step time free and constrained",
                                "decode step time with no row and with every row constrained, and the "
                                "mask's share. " + source_line(sec.files)))
    return sec


def _kernel_rows(f: Result) -> list[list[str]]:
    shapes = f.data["shapes"]
    by_rows: dict[int, list[str]] = {}
    for entries in shapes.values():
        for e in entries:
            mlx, best = e["variants"].get("mlx"), e["variants"].get(e.get("best"), {})
            by_rows.setdefault(e["rows"], []).extend(
                [fmt(med(mlx)), f"{fmt(med(best))} ({e.get('best', '–').removeprefix('cuda-')})",
                 ratio(med(mlx), med(best))])
    return [[str(m), *cells] for m, cells in sorted(by_rows.items())]


def kernels(results: list[Result], prefix: str = "generated/") -> Section:
    sec, panels = Section("kernels"), {}
    for device in DEVICES:
        files = of(results, "kernels", device)[-1:]
        if not files:
            if device == "gpu":
                sec.parts.append(not_measured("kernels", device, "python benchmarks/kernels.py"))
            continue
        f = files[0]
        sec.use(files)
        header = ["M"] + [h for shape in f.data["shapes"]
                          for h in (f"{shape} mlx (µs)", f"{shape} best kernel (µs)", "mlx / kernel")]
        sec.parts += [
            f"**Table: small-batch kernels against `mx.quantized_matmul`, {f.data.get('chip', device)}** — "
            f"{f.data.get('bits')}-bit, group {f.data.get('group_size')}, "
            f"{str(f.data.get('dtype')).removeprefix('mlx.core.')}; µs per call including MLX's dispatch, "
            f"median of {f.data.get('rounds')} interleaved rounds of {f.data.get('repeats')} calls; "
            "the best of the verified kernels at each M.",
            table(header, _kernel_rows(f)), source_line(files)]
        panels.update({f"{shape} ({DEVICE_LABEL[device]})": {
            "mx.quantized_matmul": ([e["rows"] for e in entries], [med(e["variants"]["mlx"]) for e in entries]),
            "best kernel": ([e["rows"] for e in entries],
                            [med(e["variants"][e["best"]]) for e in entries])}
            for shape, entries in f.data["shapes"].items()})
    if panels:
        sec.figures["kernels.png"] = partial(plots.lines_vs_rows, panels=panels, ylabel="µs per call")
        sec.parts.append(figure(prefix, "kernels.png", "kernel time against rows",
                                "µs per call against activation rows M for each weight shape. "
                                + source_line(sec.files)))
    return sec


AGENT_PEERS = {"locals": "locals", "mlx_lm": "mlx_lm.server"}


def _agent_caption(device: str, args: dict) -> str:
    return (f"**Table: an agent-like conversation, {DEVICE_LABEL[device]}** — "
            f"{args.get('system_tokens')}-token system prompt, {args.get('turns')} turns of "
            f"{args.get('turn_tokens')} new tokens, {args.get('max_tokens')} tokens per reply; then a "
            f"restart, then {args.get('agents')} agents sending the same system prompt at once. "
            "Time to first token in seconds.")


def agent_turns(results: list[Result], prefix: str = "generated/") -> Section:
    sec, captions, body, lines, missing = Section("agent_turns"), [], [], {}, []
    for device in DEVICES:
        files = of(results, "agent_turns", device)[-1:]
        if not files:
            missing.append(not_measured("agent_turns", device, "python benchmarks/agent_turns.py"))
            continue
        f = files[0]
        sec.use(files)
        captions.append(_agent_caption(device, f.data.get("args", {})))
        for peer, label in AGENT_PEERS.items():
            t = f.data.get("table", {}).get(peer)
            if not t:
                continue
            body.append([DEVICE_LABEL[device], label, fmt(med(t["cold_ttft_s"]), 2),
                         fmt_range(t["later_turns_ttft_s"], 2), fmt(med(t["after_restart_ttft_s"]), 2),
                         fmt(med(t["agents_last_ttft_s"]), 1), f"`{f.name}`"])
            runs = f.data.get("runs", {}).get(peer) or []
            if runs:
                lines[f"{label} ({DEVICE_LABEL[device]})"] = runs[0]["turn_ttft_s"]
    sec.parts = captions
    if body:
        sec.parts += [table(["device", "server", "turn 1 (cold)", "later turns, median (range)",
                             "after a restart", "last of the agents", "file"], body), source_line(sec.files)]
    sec.parts += missing
    if lines:
        sec.figures["agent_turns.png"] = partial(plots.lines_per_turn, series=lines,
                                                 title="time to first token per turn")
        sec.parts.append(figure(prefix, "agent_turns.png", "TTFT per turn",
                                "time to first token of each turn of one conversation (log scale). "
                                + source_line(sec.files)))
    return sec
