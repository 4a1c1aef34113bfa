"""The `--check` command as the judge of an agent's work: the patch is taken outside the
sandbox first, then the command runs confined in the agent's worktree, which is put back to
that patch afterwards (a check's reports never join the agent's work).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import git
from pathlib import Path

from agents.sandbox import Sandbox, cap_text, run_confined
from agents.worktree import RunArea

FEEDBACK_CAP = 3_000


@dataclass
class CheckVerdict:
    """Whether the worktree passed; `patch` is exactly the state that was checked."""

    passed: bool
    output: str
    patch: str
    status: str = ""
    unpatched: list[str] = field(default_factory=list)  # ignored files beside it (RunArea.unpatched_files)

    def feedback(self) -> str:
        """What the agent is shown: the command's output and how it ended."""
        return f"{self.output}\n({self.status})" if self.status else self.output

    def summary(self) -> str:
        lines = [line.strip(" =") for line in self.output.strip().splitlines() if line.strip(" =")]
        return lines[-1][:120] if lines else (self.status or ("passed" if self.passed else "failed"))


class Checker:
    """Runs one check command for any worktree of a run."""

    def __init__(self, area: RunArea, command: str, timeout_s: float = 300.0):
        self.area = area
        self.command = command
        self.timeout_s = timeout_s

    async def check(self, worktree: Path, baseline: str, sandbox: Sandbox) -> CheckVerdict:
        try:
            patch = await asyncio.to_thread(self.area.diff, worktree, baseline)
        except git.GitCommandError as exc:  # e.g. a nested repository with no commit: the agent can fix it
            return CheckVerdict(False, f"git cannot take your changes: {(exc.stderr or str(exc)).strip()}", "")
        if not patch.strip():
            # An unchanged tree can pass a check that already passed before; that is no solution.
            return CheckVerdict(False, "no file has been changed yet: write the code first", "")
        await asyncio.to_thread(self.area.clear_bytecode, worktree)
        unpatched = await asyncio.to_thread(self.area.unpatched_files, worktree)
        result = await run_confined(self.command, worktree, sandbox, timeout_s=self.timeout_s)
        await asyncio.to_thread(self.area.restore, worktree, baseline, patch)  # what the check wrote goes
        status = "timed out" if result.timed_out else f"exit code {result.returncode}"
        return CheckVerdict(result.ok, cap_text(result.output, FEEDBACK_CAP), patch, status, unpatched)
