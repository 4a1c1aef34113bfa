"""Generated section for served traffic: `locals serve` against mlx_lm.server (and llama.cpp's
server) over HTTP, from the reports that benchmarks/serve_traffic.py and `locals bench` write
(locals/traffic/report.py's JSON: per server and agent count, summaries over rounds; locals /
peer ratios of the medians). Also the served figures the README's headline table quotes.

Same contract as sections_engine: result files in, a Section out.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from locals.traffic.report import rounds_done, rounds_text
from locals.traffic.servers import PEER_ARGS
from paper import plots
from paper.markdown import Section, figure, table
from paper.results import DEVICE_LABEL, Result, fmt, fmt_range, med, of, source_line

DEVICES = ("gpu", "cpu")
OURS = "locals"
PEERS = ("mlx_lm.server", "llama.cpp")  # other servers; "locals NAME" is locals with other settings (--variant)
# (label, keys, decimals): one row per figure; two keys share a row as "a / b" of their medians.
COLD_ROWS = (("ready, s", ("ready_s",), 1), ("first token, s", ("first_token_s",), 1))
PHASE_ROWS = (("wait on server, s", ("wait_s",), 1), ("output tok/s", ("output_tps",), 1),
              ("burst tok/s", ("burst_tps",), 1), ("TTFT p50 / p99, s", ("ttft_p50_s", "ttft_p99_s"), 2),
              ("token gap p99 / max, ms", ("gap_p99_ms", "gap_max_ms"), 0))
# Model names as the benchmarks record them -> what the tables call them.
MODEL_LABEL = {"qwen3-4b": "random-weight Qwen3-4B shape, 4-bit", "qwen3-tiny": "random-weight tiny Qwen3 shape",
               "smollm2": "embedded SmolLM2-135M"}
BUSY_PERCENT = 50  # other processes' CPU use above which a caption warns that it was measured too
# The command that writes a device's report: the script on a GPU (a random model of the
# shape), `locals bench` on a CPU (the machine's default model, the embedded one).
HOW = {"gpu": "python benchmarks/serve_traffic.py", "cpu": "locals bench --out benchmarks/results/"}


def served_model(f: Result) -> str:
    """The model a served-traffic report ran: serve_traffic.py names the folder it writes after
    the shape; `locals bench` records the name it was given."""
    model = str(f.data.get("model", ""))
    return model if f.from_cli else Path(model).name


def model_label(name: str) -> str:
    return MODEL_LABEL.get(name, f"`{name}`")


def machine_label(f: Result) -> str:
    """The machine a report ran on, from what it recorded (device name, cores, memory)."""
    info = f.data.get("machine")
    if not isinstance(info, dict):
        return f.label
    name = (info.get("device_info") or {}).get("device_name") or f.label
    memory = f"{info['memory_bytes'] / 2**30:.0f} GiB" if info.get("memory_bytes") else "memory not recorded"
    return f"{name} ({info.get('cpu_count', '?')} CPU cores, {memory})"


def _workload(f: Result) -> str:
    w = f.data.get("scaled_workload") or {}

    def span(key: str) -> str:
        lo, hi = w.get(key, ("?", "?"))
        return f"{lo:g}–{hi:g}" if isinstance(lo, (int, float)) else "?"
    return (f"system prompts {span('system_tokens')} tokens, turns {span('turn_tokens')}, replies "
            f"{span('reply_tokens')}, {_count(w.get('turns'), 'turn')} an agent with {span('tool_time_s')} s of "
            f"tool time, then a burst of {w.get('burst_reply_tokens', '?')} tokens an agent")


def _count(n, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n if n is not None else '?'} {noun}s"


def _cells(summaries: dict, servers: list[str], group: str, keys: tuple, digits: int) -> list[str]:
    out = []
    for server in servers:
        figures = summaries[server].get(group, {})
        if len(keys) == 1:
            out.append(fmt_range(figures.get(keys[0]), digits))
        else:
            out.append(" / ".join(fmt(med(figures.get(k)), digits) for k in keys))
    return out


def ratio_text(r: float | None) -> str:
    """A locals / peer ratio: two decimals, or two significant digits below 0.1 (not 0.00×)."""
    if r is None:
        return "–"
    return f"{r:.2f}×" if r >= 0.1 else f"{r:.2g}×"


def _ratio_cells(ratios: dict, peers: list[str], group: str, keys: tuple) -> list[str]:
    return [" / ".join(ratio_text(ratios.get(p, {}).get(group, {}).get(k)) for k in keys) for p in peers]


def served_table(f: Result) -> str:
    summaries, ratios = f.data["summary"], f.data.get("ratios", {})
    servers = list(summaries)
    peers = [s for s in servers if s != OURS] if OURS in summaries else []
    header = ["agents", "figure", *servers, *[f"{OURS} / {p}" for p in peers]]
    groups = [("cold", COLD_ROWS)] + [(str(n), PHASE_ROWS) for n in f.data["agents"]]
    body = []
    for group, rows in groups:
        for i, (label, keys, digits) in enumerate(rows):
            body.append([group if i == 0 else "", label, *_cells(summaries, servers, group, keys, digits),
                         *_ratio_cells(ratios, peers, group, keys)])
    return table(header, body)


def _failures(f: Result) -> str | None:
    failed = {server: counts for server, counts in (f.data.get("failures") or {}).items() if any(counts.values())}
    if not failed:
        return None

    def what(key: str, n: int) -> str:
        return f"{n} round{'s' if n > 1 else ''} failed or skipped" if key == "rounds" else f"{n} at {key} agents"

    parts = [f"{server}: " + ", ".join(what(key, n) for key, n in counts.items() if n)
             for server, counts in failed.items()]
    return "Failed: " + "; ".join(parts) + " (the report's `runs` say why)."


def _caption(f: Result) -> str:
    busy = f.data.get("other_cpu_percent_before")
    warn = (f" Other processes used {busy:.0f}% of the CPU as the run began: the figures measure them too."
            if isinstance(busy, (int, float)) and busy > BUSY_PERCENT else "")
    return (f"**Table: served traffic, {f.label}** — {machine_label(f)}; "
            f"{model_label(served_model(f))}, the same weights for every server; {_workload(f)}. "
            f"Median (range) over {rounds_text(f.data)} (TTFT and gap pairs: medians); "
            f"{OURS} / peer of the medians, below 1 better for times, above 1 for rates.{_peer_args(f)}"
            f"{_kernels(f)}{warn}")


def _peer_args(f: Result) -> str:
    """The arguments peers were started with beyond their defaults (`--peer-args`), if any."""
    runs = [f"{server} ran with `{weights.split(PEER_ARGS, 1)[1]}`"
            for server, weights in (f.data.get("weights") or {}).items() if server in PEERS and PEER_ARGS in weights]
    return f" {'; '.join(runs)}." if runs else ""


def _kernels(f: Result) -> str:
    """Whether the GPU servers started on empty CUDA kernel folders (a fresh machine) or kept ones."""
    held = f.data.get("kernel_folders")
    if not held:
        return ""
    commands = held if isinstance(held, list) else [held]  # a merged report: one per command
    merged = f" Its rounds ran as {len(commands)} commands in a row on one machine." if len(commands) > 1 else ""
    kept = {server: sum(bool((h or {}).get(server)) for h in commands)
            for server in dict.fromkeys(s for h in commands for s in (h or {}))}
    if not any(kept.values()):
        return merged + (" Each server's CUDA kernel folder was empty at the start: its first round compiled "
                         "its kernels.")
    if all(n == len(commands) for n in kept.values()):
        return merged + " Each server's CUDA kernel folder was kept from an earlier run (warm starts)."
    each = [f"{server} " + ("kept from an earlier run" if n == len(commands) else "empty" if not n else
                              f"empty in {len(commands) - n} of {len(commands)} commands")
            for server, n in kept.items()]
    return merged + f" CUDA kernel folders at the start: {'; '.join(each)} (cold rounds compile their kernels)."


def served_traffic(results: list[Result], prefix: str | None = None) -> Section:
    """Each machine's newest report of each agent count, as tables; with `prefix` (the paper's
    figure folder) also a figure of the burst rates."""
    sec = Section("served_traffic")
    bursts: dict[str, dict[str, dict[str, float]]] = {}
    for device in DEVICES:
        files = newest_per_machine(_shown(_comparisons(of(results, "serve_traffic", device))))
        if not files:
            sec.parts.append(f"*{DEVICE_LABEL[device]}: not measured yet* (no served-traffic report in "
                             f"`benchmarks/results/` when this was generated; `{HOW[device]}` writes one).")
            continue
        sec.use(files)
        for f in files:
            sec.parts += [_caption(f), served_table(f)]
            if note := _failures(f):
                sec.parts.append(note)
            sec.parts.append(source_line([f]))
            for n in f.data.get("agents") or []:
                bursts.setdefault(f.label, {})[f"{n} agent{'s' if n > 1 else ''}"] = {
                    server: rate for server, by_count in f.data["summary"].items()
                    if (rate := med(by_count.get(str(n), {}).get("burst_tps"))) is not None}
    if prefix is not None and bursts:
        panels = {label: dict(sorted(groups.items(), key=lambda kv: int(kv[0].split()[0])))
                  for label, groups in bursts.items()}
        sec.figures["served_traffic.png"] = partial(plots.grouped_bars, panels=panels, ylabel="burst tok/s")
        sec.parts.append(figure(prefix, "served_traffic.png", "burst tok/s by agent count",
                                "aggregate output tok/s while every agent generates at once, median over rounds, "
                                "by agent count. " + source_line(sec.files)))
    return sec


def newest_per_machine(files: list[Result]) -> list[Result]:
    """`newest_per_agent_count` on each machine (an H100's run does not hide an H200's), the machine
    measured last first."""
    machines = dict.fromkeys(f.label for f in reversed(files))
    return [f for m in machines for f in newest_per_agent_count([g for g in files if g.label == m])]


def newest_per_agent_count(files: list[Result]) -> list[Result]:
    """Of `files` (oldest first), the newest report of each agent count measured, newest first: a run
    of 1 and 16 agents after one of 8 shows both, a run of 1 and 8 after them replaces both of theirs."""
    counts = sorted({n for f in files for n in f.data.get("agents") or []})
    chosen = {id(f): f for n in counts for f in [next(f for f in reversed(files) if n in (f.data.get("agents") or []))]}
    newest_first = [f for f in reversed(files) if id(f) in chosen]
    return newest_first or files[-1:]


def _comparisons(files: list[Result]) -> list[Result]:
    """The reports that put locals beside a peer (a run of locals alone, or beside variants of
    itself with other settings, is a diagnostic)."""
    return [f for f in files if OURS in f.data.get("summary", {}) and any(p in f.data["summary"] for p in PEERS)]


# Rounds a report needs to be the one shown: medians of warm rounds, as the bars are stated.
WARM_ROUNDS = 3


def _warm_first(files: list[Result]) -> list[Result]:
    """`files` (oldest first), only those with WARM_ROUNDS rounds done where any has: a single cold
    round is recorded in benchmarks-log.md, not shown as the served figures."""
    return [f for f in files if rounds_done(f.data) >= WARM_ROUNDS] or files


def _answered(f: Result) -> bool:
    """Whether every peer answered its agents' conversations at the report's largest agent count:
    its median of requests answered at least locals' less one burst (a peer whose burst runs out of
    memory still compares). A peer that died mid-phase has fast "waits" and no output: its ratios
    would say nothing."""
    n = str(max(f.data.get("agents") or [0]))

    def answered(server: str) -> int:
        counts = [phase["figures"].get("requests", 0) - phase["figures"].get("failed", 0)
                  for run in f.data.get("runs", {}).get(server, []) if (phase := (run.get("phases") or {}).get(n))]
        return sorted(counts)[len(counts) // 2] if counts else 0

    ours = answered(OURS)
    return all(answered(p) >= ours - int(n) for p in PEERS if p in f.data.get("summary", {}))


def _even(f: Result) -> bool:
    """False where a server began on an empty kernel folder and did fewer rounds than another (the
    time limit cut it): its median then mixes its cold round with fewer warm ones than the other's."""
    held = f.data.get("kernel_folders")
    if not isinstance(held, dict):
        return True
    done = {server: rounds_done({"summary": {server: figures}}) for server, figures in f.data.get("summary", {}).items()}
    most = max(done.values(), default=0)
    return not any(done.get(server, most) < most for server, kept in held.items() if not kept)


def _shown(files: list[Result]) -> list[Result]:
    """The reports one may show (oldest first): of warm rounds (`_warm_first`), and of those the ones
    whose peers answered (`_answered`) and whose medians compare (`_even`) where any do."""
    warm = _warm_first(files)
    answered = [f for f in warm if _answered(f)] or warm
    return [f for f in answered if _even(f)] or answered


def newest_served(results: list[Result], device: str, model: str) -> Result | None:
    """The newest served-traffic report of `model` on `device` that `_shown` allows, if any."""
    files = _shown([f for f in _comparisons(of(results, "serve_traffic", device)) if served_model(f) == model])
    return files[-1] if files else None


def headline(f: Result, key: str) -> tuple[int, dict[str, float | None]]:
    """(agent count, {server: median of `key`}) at the largest agent count the report measured."""
    n = max(f.data["agents"])
    return n, {server: med(s.get(str(n), {}).get(key)) for server, s in f.data["summary"].items()}
