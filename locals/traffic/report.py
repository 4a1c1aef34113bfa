"""The served-traffic figures: per phase from the replies, over rounds as medians and ranges,
locals against each peer as ratios, and the table that shows them.

Per agent count (one phase of conversations, then one burst):
- wait_s: the agents' time waiting on the server, the sum of their conversation requests' wall
  times (tool time is not waiting);
- output_tps: conversation output tokens over the time from the first request to the last reply;
- burst_tps: burst output tokens over the time from the burst's requests to its last reply;
- ttft_p50_s, ttft_p99_s: time to first token over every request of the phase, burst included;
- gap_p99_ms, gap_max_ms: the gaps between streamed chunks of tokens, pooled over all requests.
Per server start (cold): ready_s (process start to its readiness answer) and first_token_s
(process start to the first token of the first request). Ratios are locals / peer of the
medians: below 1 is better for times, above 1 for rates.
"""

from __future__ import annotations

import math

from rich.table import Table

from locals.measure import summary
from locals.traffic.driver import Reply

# (key, label, decimals); which way is better follows from the unit.
PHASE_METRICS = (
    ("wait_s", "wait on server, s", 1),
    ("output_tps", "output tok/s", 1),
    ("burst_tps", "burst tok/s", 1),
    ("ttft_p50_s", "TTFT p50, s", 2),
    ("ttft_p99_s", "TTFT p99, s", 2),
    ("gap_p99_ms", "token gap p99, ms", 0),
    ("gap_max_ms", "token gap max, ms", 0),
)
COLD_METRICS = (("ready_s", "ready, s", 1), ("first_token_s", "first token, s", 1))


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) with linear interpolation between ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _rate(replies: list[Reply], start: float | None = None) -> float | None:
    if not replies:
        return None
    begin = min(r.sent for r in replies) if start is None else start
    span = max(r.ended for r in replies) - begin
    return sum(r.completion_tokens for r in replies) / span if span > 0 else None


def phase_figures(replies: dict[str, list[Reply]]) -> dict:
    """The figures of one phase (see the module docstring), plus its counts."""
    talks, burst = replies["agents"], replies["burst"]
    every = talks + burst
    gaps = [g for r in every for g in r.gaps]

    def ms(seconds):
        return None if seconds is None else seconds * 1000

    ttfts = [r.ttft for r in every if r.ttft is not None]
    return {
        "wait_s": sum(r.wall for r in talks),
        "output_tps": _rate(talks),
        "burst_tps": _rate(burst, burst[0].sent if burst else None),
        "ttft_p50_s": percentile(ttfts, 0.5), "ttft_p99_s": percentile(ttfts, 0.99),
        "gap_p99_ms": ms(percentile(gaps, 0.99)), "gap_max_ms": ms(max(gaps, default=None)),
        "requests": len(every), "failed": sum(r.error is not None for r in every),
        "output_tokens": sum(r.completion_tokens for r in every),
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in every),
        "cached_tokens": sum(r.cached_tokens or 0 for r in every),
        "tokens_counted": sorted({r.counted for r in every}),
    }


def reply_record(reply: Reply) -> dict:
    """One request in the JSON report (its gaps summarised; the phase pools them)."""
    return {"agent": reply.agent, "turn": reply.turn, "sent_s": round(reply.sent, 4),
            "ttft_s": reply.ttft, "wall_s": reply.wall, "completion_tokens": reply.completion_tokens,
            "prompt_tokens": reply.prompt_tokens, "cached_tokens": reply.cached_tokens, "chunks": reply.chunks,
            "gap_max_s": max(reply.gaps, default=None), "finish": reply.finish, "tool_calls": len(reply.calls),
            "counted": reply.counted, "error": reply.error}


def summarise(runs: dict[str, list[dict]], agents: list[int]) -> dict:
    """Medians and ranges over rounds: {server: {"cold": {metric: summary}, "<n>": {metric: summary}}}."""
    out = {}
    for server, rounds in runs.items():
        done = [r for r in rounds if not r.get("error")]
        table = {"cold": _over(done, lambda r: r, COLD_METRICS)}
        for n in agents:
            table[str(n)] = _over([r["phases"][str(n)]["figures"] for r in done if str(n) in r["phases"]],
                                  lambda f: f, PHASE_METRICS)
        out[server] = table
    return out


def failures(runs: dict[str, list[dict]]) -> dict:
    """Failed requests over all rounds, and rounds whose server failed: {server: {"<n>": count, "rounds": count}}."""
    out = {}
    for server, rounds in runs.items():
        counts: dict[str, int] = {"rounds": sum(bool(r.get("error")) for r in rounds)}
        for r in rounds:
            for n, phase in r["phases"].items():
                counts[n] = counts.get(n, 0) + phase["figures"]["failed"]
        out[server] = counts
    return out


def _over(records: list[dict], pick, metrics) -> dict:
    out = {}
    for key, _, _ in metrics:
        values = [pick(r)[key] for r in records if pick(r).get(key) is not None]
        out[key] = summary(values) if values else None
    return out


def ratios(summaries: dict, ours: str = "locals") -> dict:
    """locals / peer of the medians, for every peer, figure and agent count."""
    if ours not in summaries:
        return {}
    out = {}
    for peer, theirs in summaries.items():
        if peer == ours:
            continue
        out[peer] = {group: {key: (mine[key]["median"] / theirs[group][key]["median"]
                                   if mine.get(key) and theirs.get(group, {}).get(key)
                                   and theirs[group][key]["median"] else None)
                             for key in mine}
                     for group, mine in summaries[ours].items()}
    return out


def _cell(s: dict | None, decimals: int) -> str:
    if not s:
        return "—"
    if s["n"] == 1 or s["min"] == s["max"]:
        return f"{s['median']:.{decimals}f}"
    return f"{s['median']:.{decimals}f} ({s['min']:.{decimals}f}–{s['max']:.{decimals}f})"


def rounds_done(report: dict) -> int:
    """How many rounds the summary holds (fewer than asked where the time limit skipped some)."""
    return max((s.get("n", 0) for server in report.get("summary", {}).values() for group in server.values()
                for s in group.values() if isinstance(s, dict)), default=0)


def rounds_text(report: dict) -> str:
    done, asked = rounds_done(report), report.get("rounds")
    noun = "round" if done == 1 else "rounds"
    return f"{done} {noun}" if done == asked or not asked else f"{done} {noun} ({asked} asked)"


def table(report: dict) -> Table:
    """Servers side by side: median (range) over rounds, then locals / each peer."""
    summaries, rates = report["summary"], report["ratios"]
    servers = list(summaries)
    peers = [s for s in servers if s != "locals"]
    out = Table(title=f"served traffic · median (range) over {rounds_text(report)}")
    out.add_column("agents", justify="right")
    out.add_column("figure")
    for name in servers:
        out.add_column(name, justify="right")
    for peer in peers if "locals" in summaries else []:
        out.add_column(f"locals / {peer}", justify="right")
    failed = report["failures"]
    groups = [("cold", "cold", COLD_METRICS)] + [(str(n), str(n), PHASE_METRICS) for n in report["agents"]]
    for group, label, metrics in groups:
        rows = [(name, [_cell(summaries[s].get(group, {}).get(key), decimals) for s in servers],
                 [f"{r:.2f}×" if (r := rates.get(p, {}).get(group, {}).get(key)) else "—"
                  for p in peers if "locals" in summaries]) for key, name, decimals in metrics]
        key = "rounds" if group == "cold" else group
        if any(failed[s].get(key) for s in servers):
            rows.append(("rounds failed or skipped" if group == "cold" else "failed requests",
                         [str(failed[s].get(key, 0)) for s in servers], []))
        for i, (name, cells, ratio_cells) in enumerate(rows):
            out.add_row(label if i == 0 else "", name, *cells, *ratio_cells, end_section=i == len(rows) - 1)
    return out
