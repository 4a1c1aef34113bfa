"""How a run looks in the terminal: a live rich table of parts and agents, then a summary.

It only consumes runner events and the final RunReport; it never drives the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from agents.events import AgentStep, CheckDone, Event, Part, PartDone, PlanReady
from agents.runner import RunReport

_STATUS_STYLE = {"passed": "green", "answered": "green", "applied": "green", "failed": "red", "error": "red",
                 "conflict": "yellow", "skipped": "dim", "checking": "cyan", "timeout": "red", "stopped": "dim"}


@dataclass
class _Row:
    step: int = 0
    action: str = ""
    status: str = "starting"
    check: str = ""
    tokens: int = 0


class LiveDisplay:
    """An EventSink that keeps a live table on `console` while used as a context manager."""

    def __init__(self, console: Console, max_steps: int, question: bool = False):
        self.console = console
        self.max_steps = max_steps
        self.question = question  # question mode: no planner, no check column
        self.parts: list[Part] = []
        self.part_status: dict[int, str] = {}
        self.rows: dict[tuple[int, int], _Row] = {}
        self.note = ""
        self._live = Live(self.render(), console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> "LiveDisplay":
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.update(self.render())
        self._live.__exit__(*exc)
        if not self.console.is_terminal:
            self.console.line()  # rich ends a non-terminal live render without a newline

    def __call__(self, event: Event) -> None:
        if isinstance(event, PlanReady):
            self.parts, self.note = event.parts, event.note
        elif isinstance(event, AgentStep):
            row = self.rows.setdefault((event.part, event.agent), _Row())
            row.step, row.action, row.status, row.tokens = event.step, event.action, event.status, event.tokens
        elif isinstance(event, CheckDone):
            row = self.rows.setdefault((event.part, event.agent), _Row())
            row.check = ("pass: " if event.passed else "fail: ") + event.summary
        elif isinstance(event, PartDone):
            self.part_status[event.part] = event.status
        self._live.update(self.render())

    def render(self) -> Group:
        items = [] if self.parts else [Text("starting…" if self.question else "planning…", style="dim")]
        if self.note:
            items.append(Text(self.note, style="yellow"))
        # One line a row at any width: the two text columns share what is left, cut with an ellipsis.
        table = Table(box=None, pad_edge=False, header_style="bold", expand=True)
        names = ("part", "agent", "step", "last action") + (() if self.question else ("check",)) + ("tokens",)
        for name in names:
            ratio = {"last action": 3, "check": 2}.get(name)
            table.add_column(name, no_wrap=True, overflow="ellipsis", ratio=ratio, min_width=5 if ratio else None)
        for (part, agent), row in sorted(self.rows.items()):
            style = _STATUS_STYLE.get(row.status, "")
            status = self.part_status.get(part, "")
            cells = [f"{part + 1}" + (f" {status}" if status else ""), f"{agent + 1}", f"{row.step}/{self.max_steps}",
                     Text(row.action, style=style), *(() if self.question else (row.check,)), f"{row.tokens:,}"]
            table.add_row(*cells)
        if self.parts and len(self.parts) > 1:
            items.append(Text("\n".join(f"part {p.index + 1}: {p.goal}" for p in self.parts), style="dim"))
        items.append(table)
        return Group(*items)


def print_summary(out: Console, console: Console, report: RunReport) -> None:
    """The answer (question mode) on `out`; the outcome per part, time and tokens on `console`."""
    if report.answer:
        out.print(report.answer, markup=False, highlight=False, soft_wrap=True)  # never cut: code lines stay whole
    for part in report.parts:
        style = _STATUS_STYLE.get(part.status, "")
        who = f" by agent {part.winner + 1}" if part.winner is not None else ""
        files = f": {', '.join(part.files)}" if part.files and part.status == "applied" else ""
        line = Text(f"part {part.index + 1} {part.status}{who}{files}", style=style)
        if part.detail:
            line.append(f" — {part.detail}", style="")
        console.print(line)
    tokens = report.prompt_tokens + report.completion_tokens
    console.print(f"{report.elapsed_s:.1f} s, {tokens:,} tokens "
                  f"({report.prompt_tokens:,} prompt, {report.completion_tokens:,} generated)", style="dim", highlight=False)
    if report.kept_at:
        console.print(f"worktrees kept in {report.kept_at}", style="dim")
