"""Reports a run's progress to the server it talks to (`POST <base>/v1/locals/team`), where the
locals dashboard shows the team: agents, worktrees, steps, checks and the applied patch.

An EventSink like the live display. Each report is the run's whole state, so a lost one
costs nothing; at most one is in flight and events meanwhile fold into the next; a
heartbeat every HEARTBEAT_S tells the board the run is alive through a long check.
Reporting never affects the run: a server without the endpoint (any other OpenAI server)
turns it off at the first answer, and network errors are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import aiohttp

from agents.events import AgentStarted, AgentStep, CheckDone, Event, PartDone, PlanReady
from agents.runner import RunOptions, RunReport
from locals.client import v1_url

log = logging.getLogger(__name__)
HEARTBEAT_S = 15.0
TIMEOUT_S = 3.0
PATCH_CAP = 20_000  # the board keeps this much of a patch; the whole one is in the project


class TeamReporter:
    """Use as an async context manager around the run; call it with events, then `finish`."""

    def __init__(self, base_url: str, options: RunOptions):
        self.url = v1_url(base_url) + "/locals/team"
        self.state: dict[str, Any] = {
            "run": options.run_id, "task": options.task, "directory": str(options.directory),
            "check": options.check, "mode": "change" if options.check else "question", "state": "planning",
            "message": "", "started": time.time(), "max_steps": options.max_steps, "parts": [], "agents": []}
        self._agents: dict[tuple[int, int], dict[str, Any]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._sending: asyncio.Task | None = None
        self._heartbeat: asyncio.Task | None = None
        self._again = False
        self.off = False  # the server has no team board (or refused one report): stop sending

    async def __aenter__(self) -> "TeamReporter":
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
        self._heartbeat = asyncio.create_task(self._beat())
        self._kick()
        return self

    async def __aexit__(self, exc_type, *exc: object) -> None:
        self._heartbeat.cancel()
        if self.state["state"] in ("planning", "running"):
            self.state["state"] = "stopped"  # left without finish(): cancelled or failed
        with contextlib.suppress(Exception, asyncio.CancelledError):
            if self._sending is not None:
                await asyncio.wait_for(self._sending, TIMEOUT_S)
            if not self.off:
                await self._post()  # the last state, whatever was in flight before
        await self._session.close()

    def __call__(self, event: Event) -> None:
        if isinstance(event, PlanReady):
            self.state["state"] = "running"
            self.state["parts"] = [{"index": p.index, "goal": p.goal, "status": "pending", "winner": None,
                                    "files": list(p.files), "detail": "", "patch": ""} for p in event.parts]
        elif isinstance(event, AgentStarted):
            self._agents[(event.part, event.agent)] = {
                "part": event.part, "agent": event.agent, "worktree": event.worktree, "session": event.session,
                "step": 0, "action": "starting", "status": "working", "check": None, "check_passed": None,
                "tokens": 0}
        elif isinstance(event, AgentStep):
            self._agent(event.part, event.agent).update(step=event.step, action=event.action, status=event.status,
                                                        tokens=event.tokens)
        elif isinstance(event, CheckDone):
            self._agent(event.part, event.agent).update(check=event.summary, check_passed=event.passed)
        elif isinstance(event, PartDone):
            self._part(event.part).update(status=event.status, winner=event.winner, files=list(event.files),
                                          detail=event.detail, patch=event.patch[:PATCH_CAP])
        self._kick()

    def finish(self, report: RunReport) -> None:
        """The run's outcome (timeouts included, which come as no event)."""
        for part in report.parts:
            self._part(part.index).update(status=part.status, winner=part.winner, files=list(part.files),
                                          detail=part.detail)
        self.state.update(state="done", message=report.message)
        self._kick()

    def _agent(self, part: int, agent: int) -> dict[str, Any]:
        return self._agents.setdefault((part, agent), {
            "part": part, "agent": agent, "worktree": "", "session": None, "step": 0, "action": "",
            "status": "working", "check": None, "check_passed": None, "tokens": 0})

    def _part(self, index: int) -> dict[str, Any]:
        parts = self.state["parts"]
        found = next((p for p in parts if p["index"] == index), None)
        if found is None:
            found = {"index": index, "goal": self.state["task"], "status": "pending", "winner": None,
                     "files": [], "detail": "", "patch": ""}
            parts.append(found)
        return found

    def _kick(self) -> None:
        """Send the state now, or right after the report in flight."""
        if self.off or self._session is None:
            return
        if self._sending is not None and not self._sending.done():
            self._again = True
            return
        self._sending = asyncio.create_task(self._send())

    async def _send(self) -> None:
        self._again = True
        while self._again and not self.off:
            self._again = False
            await self._post()

    async def _post(self) -> None:
        self.state["agents"] = [self._agents[key] for key in sorted(self._agents)]
        try:
            async with self._session.post(self.url, json=self.state) as resp:
                if resp.status >= 400:
                    # No board here (another server, an older locals) or a report it refuses: stop.
                    self.off = True
                    log.debug("team report refused (%s): %s", resp.status, (await resp.text())[:300])
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.debug("team report not sent: %s", exc)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            self._kick()
