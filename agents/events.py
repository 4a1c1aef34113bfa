"""Messages from the runner to whoever shows progress (the live display, --json, tests).

Plain dataclasses; the runner never knows how they are shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Part:
    """One piece of the task: what to do, which files it concerns, which parts (0-based) come first."""

    index: int
    goal: str
    files: list[str] = field(default_factory=list)
    depends_on: list[int] = field(default_factory=list)


@dataclass
class PlanReady:
    parts: list[Part]
    note: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class AgentStarted:
    """An agent was given its worktree (a folder name under the run's area) and its session id."""

    part: int
    agent: int
    worktree: str
    session: str


@dataclass
class AgentStep:
    """An agent did something: `action` is a one-line description of its last tool call."""

    part: int
    agent: int
    step: int
    action: str
    tokens: int
    status: str = "working"


@dataclass
class CheckDone:
    part: int
    agent: int
    passed: bool
    summary: str


@dataclass
class PartDone:
    part: int
    status: str  # "applied", "failed", "conflict", "skipped", "answered", "unchanged"
    winner: int | None = None
    files: list[str] = field(default_factory=list)
    detail: str = ""
    patch: str = ""  # the winner's diff, when one was applied (or kept after a conflict)


Event = PlanReady | AgentStarted | AgentStep | CheckDone | PartDone
EventSink = Callable[[Event], None]


def ignore(_event: Event) -> None:
    """An EventSink that shows nothing."""


def fan_out(*sinks: EventSink) -> EventSink:
    """One EventSink that hands each event to every one of `sinks`, in order."""

    def each(event: Event) -> None:
        for sink in sinks:
            sink(event)

    return each
