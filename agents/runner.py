"""The team runner behind `locals run`: plan, then for each part N agents in their own
worktrees; the first patch whose worktree passes the check is applied to the project.

Invariants: the user's working tree is written only by `apply_patch`; every worktree and
the run folder are removed on success, failure, timeout and cancellation (Ctrl-C) unless
`keep` is set.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agents.agent import Agent, AgentResult, sampling_for
from agents.check import Checker
from agents.events import AgentStarted, EventSink, Part, PartDone, PlanReady, ignore
from agents.patch_apply import recover
from agents.planner import make_plan, single_part
from agents.prompts import asker_messages, coder_messages
from agents.sandbox import make_sandbox
from agents.tools import READ_TOOLS, WRITE_TOOLS, Toolbox
from agents.worktree import RunArea, apply_patch, clean_stale_runs, open_project, project_listing
from locals.client import ChatClient


@dataclass
class RunOptions:
    """Everything `locals run` was asked to do; `check` None means question mode."""

    task: str
    directory: Path
    check: str | None = None
    agents: int = 4
    parts: int | None = None  # None: the planner decides
    max_steps: int = 12
    timeout_s: float = 1800.0
    sandbox: bool = True
    network: bool = False
    keep: bool = False
    command_timeout_s: float = 120.0
    check_timeout_s: float = 300.0
    max_tokens: int = 1024
    # Names the run to the server: each agent's requests carry `X-Session-Id: <run_id>/p1-a2`.
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])


@dataclass
class PartReport:
    index: int
    goal: str
    status: str = "pending"  # applied, conflict, failed, skipped, answered, timeout
    winner: int | None = None
    files: list[str] = field(default_factory=list)
    detail: str = ""


@dataclass
class RunReport:
    """The outcome of a run, as shown in the summary and printed by --json."""

    mode: str
    ok: bool = False
    message: str = ""
    answer: str = ""
    parts: list[PartReport] = field(default_factory=list)
    elapsed_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    kept_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def run_team(options: RunOptions, client: ChatClient, on_event: EventSink = ignore) -> RunReport:
    """Run the whole task; never raises for an agent's failure, only for bad input or setup."""
    repo = open_project(options.directory)
    recover(repo)  # an apply a killed run cut short: finished before anything else reads the tree
    clean_stale_runs()
    area = RunArea(repo)
    report = RunReport(mode="change" if options.check else "question")
    started = time.monotonic()
    team = Team(options, client, area, report, on_event)
    try:
        try:
            await asyncio.wait_for(team.plan_and_run(project_listing(repo)), options.timeout_s)
        except asyncio.TimeoutError:
            if not report.parts:
                report.parts = [PartReport(0, options.task)]
            for part in report.parts:
                if part.status == "pending":
                    part.status, part.detail = "timeout", f"stopped after {options.timeout_s:g} s"
        finish_report(report)
    finally:
        report.elapsed_s = round(time.monotonic() - started, 2)
        report.prompt_tokens, report.completion_tokens = team.tokens()
        if options.keep:
            area.mark_kept()
            report.kept_at = str(area.path)
        else:
            area.cleanup()
    return report


def finish_report(report: RunReport) -> None:
    """Set ok and the one-line message from the parts' outcomes."""
    statuses = [p.status for p in report.parts]
    if report.mode == "question":
        report.ok = statuses == ["answered"]
        report.message = "answered" if report.ok else "no agent found an answer"
        return
    report.ok = all(s == "applied" for s in statuses)
    if report.ok:
        files = sorted({f for p in report.parts for f in p.files})
        report.message = "applied: " + ", ".join(files)
    else:
        bad = next(p for p in report.parts if p.status != "applied")
        report.message = f"part {bad.index + 1} {bad.status}: {bad.detail}".rstrip(": ")


class Team:
    """Runs the parts (in dependency order, independent ones at once) and their agents."""

    def __init__(self, options: RunOptions, client: ChatClient, area: RunArea, report: RunReport, on_event: EventSink):
        self.options, self.client, self.area = options, client, area
        self.report, self.on_event = report, on_event
        self.checker = Checker(area, options.check, options.check_timeout_s) if options.check else None
        # Serialises everything that writes the user's repository (worktree add/remove, apply).
        self.git_lock = asyncio.Lock()
        self.agents: list[Agent] = []
        self.planner_tokens = (0, 0)

    def tokens(self) -> tuple[int, int]:
        prompt = self.planner_tokens[0] + sum(a.result.prompt_tokens for a in self.agents)
        return prompt, self.planner_tokens[1] + sum(a.result.completion_tokens for a in self.agents)

    async def plan_and_run(self, listing: str) -> None:
        if self.options.check:
            plan = await make_plan(self.client, self.options.task, listing, self.options.parts,
                                   session=f"{self.options.run_id}/plan")
        else:
            plan = PlanReady(single_part(self.options.task))
        self.planner_tokens = plan.prompt_tokens, plan.completion_tokens
        self.on_event(plan)
        self.report.parts = [PartReport(p.index, p.goal) for p in plan.parts]
        await self.run_parts(plan.parts, listing)

    async def run_parts(self, parts: list[Part], listing: str) -> None:
        done = {p.index: asyncio.Event() for p in parts}

        async def one(part: Part) -> None:
            try:
                for dep in part.depends_on:
                    await done[dep].wait()
                failed = [d + 1 for d in part.depends_on if self.report.parts[d].status != "applied"]
                if failed:
                    self._part_done(part.index, "skipped", detail=f"needs part {failed[0]}, which did not pass")
                else:
                    await self.run_part(part, len(parts), listing)
            finally:
                done[part.index].set()

        await asyncio.gather(*(one(p) for p in parts))

    async def run_part(self, part: Part, n_parts: int, listing: str) -> None:
        label = f"p{part.index + 1}"
        async with self.git_lock:
            snap = await asyncio.to_thread(self.area.snapshot, label)
            worktrees = [await asyncio.to_thread(self.area.add_worktree, f"{label}-a{i + 1}", snap)
                         for i in range(self.options.agents)]
        agents = [self._agent(part, i, path, base, n_parts, listing) for i, (path, base) in enumerate(worktrees)]
        for agent, (path, _) in zip(agents, worktrees):
            self.on_event(AgentStarted(part.index, agent.index, path.name, agent.session))
        self.agents += agents
        try:
            winner = await race(agents)
            await self._settle(part, winner, [a.result for a in agents])
        finally:
            if self.options.keep:
                for agent, (path, _) in zip(agents, worktrees):
                    (path.parent / f"{path.name}.transcript.json").write_text(json.dumps(agent.messages, indent=1))
            else:
                async with self.git_lock:
                    for path, _ in worktrees:
                        await asyncio.to_thread(self.area.remove_worktree, path)

    def _agent(self, part: Part, i: int, path: Path, base: str, n_parts: int, listing: str) -> Agent:
        tmp = self.area.path / f"{path.name}-tmp"
        tmp.mkdir(exist_ok=True)
        sandbox = make_sandbox(path, tmp, network=self.options.network, enabled=self.options.sandbox)
        names = [line for line in listing.splitlines() if not line.startswith("... and ")]
        if self.checker is None:
            toolbox = Toolbox(path, sandbox, READ_TOOLS, self.options.command_timeout_s)
            named = toolbox.named_files(self.options.task, names)
            messages = asker_messages(self.options.task, listing, named)
            check = None
        else:
            toolbox = Toolbox(path, sandbox, WRITE_TOOLS, self.options.command_timeout_s)
            named = toolbox.named_files(" ".join([self.options.task, part.goal, *part.files]), names)
            messages = coder_messages(self.options.task, part, n_parts, self.options.check, listing, named)
            checker = self.checker

            async def check():
                return await checker.check(path, base, sandbox)

        return Agent(part.index, i, self.client, toolbox, messages, sampling_for(i, self.options.max_tokens),
                     self.options.max_steps, self.on_event, check, session=f"{self.options.run_id}/{path.name}")

    async def _settle(self, part: Part, winner: AgentResult | None, results: list[AgentResult]) -> None:
        if winner is None:
            self._part_done(part.index, "failed", detail=failure_detail(results, self.checker is not None))
        elif self.checker is None:
            self.report.answer = winner.summary
            self._part_done(part.index, "answered", winner=winner.agent)
        else:
            patch = winner.verdict.patch
            async with self.git_lock:
                applied = await asyncio.to_thread(apply_patch, self.area, patch, f"p{part.index + 1}")
            if applied.applied:
                notes = applied.notes + _unpatched_note(winner.verdict.unpatched)
                note = f"note: {'; '.join(notes)}" if notes else ""
                self._part_done(part.index, "applied", winner=winner.agent, files=applied.files, detail=note,
                                patch=patch)
            else:
                why = applied.error if applied.refused else "the passing patch does not apply to your current files"
                detail = f"{why}; kept at {applied.kept_at}"
                self._part_done(part.index, "conflict", winner=winner.agent, files=applied.files, detail=detail,
                                patch=patch)

    def _part_done(self, index: int, status: str, winner: int | None = None, files: list[str] | None = None,
                   detail: str = "", patch: str = "") -> None:
        report = self.report.parts[index]
        report.status, report.winner, report.files, report.detail = status, winner, files or [], detail
        self.on_event(PartDone(index, status, winner, report.files, detail, patch))


def _unpatched_note(paths: list[str]) -> list[str]:
    """The files ignore rules kept out of the winning patch that were beside its check."""
    if not paths:
        return []
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    return [f"its check ran beside files your ignore rules keep out of the patch ({shown}): it may not pass on "
            "your tree without them"]


async def race(agents: list[Agent]) -> AgentResult | None:
    """Run the agents at once; the first to pass (or answer) wins and the others are cancelled."""
    tasks = [asyncio.create_task(a.run()) for a in agents]
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                result = task.result()
                if result.status in ("passed", "answered"):
                    return result
        return None
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def failure_detail(results: list[AgentResult], with_check: bool) -> str:
    errors = [r.summary for r in results if r.status == "error"]
    if errors and len(errors) == len(results):
        return "every agent hit an error: " + errors[0][:200]
    if not with_check:
        return "no agent answered"
    last = next((r.verdict for r in results if r.verdict is not None), None)
    tail = f"; last check: {last.summary()}" if last else "; no agent changed a file"
    return f"no agent's work passed the check ({len(results)} tried){tail}"
