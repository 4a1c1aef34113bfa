"""The served-traffic benchmark end to end: servers interleaved in rounds (order rotated each
round), each started fresh per round so every round measures its cold start too, then driven
with each agent count in turn; every reply kept; the report saved after each server's round so
a run cut short keeps what it measured.

Round r plans its traffic from seed + r (all servers of a round get the same conversations);
a nonce per run opens the system prompts, so what a server kept on disk from an earlier run is
not found again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from locals.measure import interleaved
from locals.traffic import servers as srv
from locals.traffic.driver import drive
from locals.traffic.report import failures, phase_figures, ratios, reply_record, summarise
from locals.traffic.workload import Workload, plan_agents


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to run: the servers, the agent counts (one phase each, in this order), the rounds."""

    servers: tuple[srv.ServerSpec, ...]
    agents: tuple[int, ...]
    rounds: int
    workload: Workload
    seed: int = 0
    ready_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    time_limit_s: float | None = None  # no server round starts that would likely end past it


def serve_round(spec: srv.ServerSpec, plan: Plan, round_index: int, nonce: str, log_dir: Path,
                on_phase: Callable[[str | None], None]) -> dict:
    """One fresh server through every agent count; a server that fails is recorded, not raised.
    `on_phase` hears a label as each phase starts and None as it ends."""
    log_path = log_dir / f"{spec.name.replace(' ', '-')}-round{round_index + 1}.log"  # a variant's name has a space
    record: dict = {"round": round_index, "seed": plan.seed + round_index, "log": log_path.name, "phases": {}}
    pending = list(plan.agents)
    try:
        running = srv.start(spec, log_path, plan.ready_timeout_s)
    except Exception as exc:  # a server that cannot start loses its round; the others go on
        record["error"] = str(exc)
        pending = []
    else:
        record["ready_s"] = running.ready_s
        try:
            while pending and running.process.poll() is None:
                n = pending.pop(0)
                on_phase(f"round {round_index + 1} · {spec.name} · {n} agent{'s' if n > 1 else ''}")
                _phase(record, running, plan, n, nonce)
                on_phase(None)
            if pending:
                record["error"] = (f"{spec.name} exited during the run; its log ({log_path}) ends:\n"
                                   f"{srv.log_tail(log_path)}")
        finally:
            srv.stop(running)
    for _ in pending:
        on_phase(None)
    return record


def _phase(record: dict, running: srv.Running, plan: Plan, agents: int, nonce: str) -> None:
    plans = plan_agents(agents, plan.workload, record["seed"], nonce)
    replies = asyncio.run(drive(running.url, plans, running.zero, plan.request_timeout_s))
    first = replies["agents"][0] if replies["agents"] else None
    if "first_token_s" not in record and first is not None and first.first is not None:
        record["first_token_s"] = first.first
    record["phases"][str(agents)] = {
        "figures": phase_figures(replies), "server_stats": srv.engine_stats(running),
        "replies": {phase: [reply_record(r) for r in rs] for phase, rs in replies.items()}}


def run(plan: Plan, log_dir: Path, on_phase: Callable[[str | None], None],
        on_round: Callable[[dict], None] | None = None) -> dict:
    """Run the benchmark; `on_phase` hears each phase start (a label) and end (None), `on_round`
    gets the report so far after each server's round."""
    nonce = secrets.token_hex(4)
    runs: dict[str, list[dict]] = {s.name: [] for s in plan.servers}
    report = {"benchmark": "serve_traffic", "when": time.strftime("%Y-%m-%d %H:%M:%S"), "nonce": nonce,
              "servers": {s.name: {"command": [portable(p) for p in s.command], "env": s.env} for s in plan.servers},
              "agents": list(plan.agents), "rounds": plan.rounds, "seed": plan.seed,
              "workload": dataclasses.asdict(plan.workload), "scaled_workload": dataclasses.asdict(
                  plan.workload.scaled()), "runs": runs}

    start = time.perf_counter()
    durations: dict[str, list[float]] = {s.name: [] for s in plan.servers}

    def runner(spec: srv.ServerSpec):
        def one_round() -> dict:
            index, began = len(runs[spec.name]), time.perf_counter()
            # A server's round is predicted from its own rounds (a cold locals and a cold peer differ
            # by minutes); its first round always starts while time is left: a comparison needs it.
            predicted = max(durations[spec.name], default=0.0)
            if plan.time_limit_s and began - start + predicted > plan.time_limit_s:
                record = {"round": index, "phases": {}, "error": f"skipped: the time limit "
                          f"({plan.time_limit_s:.0f} s) would have been passed"}
                for _ in plan.agents:
                    on_phase(None)
            else:
                record = serve_round(spec, plan, index, nonce, log_dir, on_phase)
                durations[spec.name].append(time.perf_counter() - began)
            runs[spec.name].append(record)
            if on_round is not None:
                on_round(finish(report))
            return record
        return one_round

    interleaved(plan.rounds, {s.name: runner(s) for s in plan.servers}, warmup=False)
    return finish(report)


def finish(report: dict) -> dict:
    """The report with its summaries and ratios computed from the runs so far."""
    report["summary"] = summarise(report["runs"], report["agents"])
    report["ratios"] = ratios(report["summary"])
    report["failures"] = failures(report["runs"])
    return report


# What must agree for reports to be one run's rounds: the servers, the traffic and the machine.
SAME_RUN = ("servers", "agents", "workload", "model", "backend", "weights", "machine")


def merge(reports: list[dict], names: list[str]) -> dict:
    """Reports written one after another on one machine (each a command of at most ten minutes,
    the device's limit) as one report: each server's rounds in order, renumbered; the kernel
    folders each command started with kept in order; refused where they ran different things."""
    first = reports[0]
    for name, other in zip(names[1:], reports[1:]):
        differ = [key for key in SAME_RUN if other.get(key) != first.get(key)]
        if differ:
            raise ValueError(f"{name} ran other {', '.join(differ)} than {names[0]}: not rounds of one run")
    runs: dict[str, list[dict]] = {server: [] for server in first["runs"]}
    for report in reports:
        for server, rounds in report["runs"].items():
            runs[server] += [{**r, "round": len(runs[server]) + i} for i, r in enumerate(rounds)]
    merged = {**first, "runs": runs, "rounds": sum(r["rounds"] for r in reports), "merged_from": names,
              "kernel_folders": [r.get("kernel_folders") for r in reports], "logs": [r.get("logs") for r in reports],
              "finished": reports[-1].get("finished")}
    return finish(merged)


def portable(part: str) -> str:
    """A path as a report keeps it: its name only (the report travels; the machine's folders do not)."""
    return Path(part).name if os.path.isabs(part) else part


def save(report: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    return path
