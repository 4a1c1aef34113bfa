"""Turn a tool and a running server into a launch: config changes, prep commands, argv, env.

`plan()` decides everything without side effects (tests inspect it); `apply_changes()`
writes the tool's own files through configfiles (backup + manifest); `execute()` runs
the prep commands and replaces this process with the tool.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from integrations import configfiles
from integrations.base import ConfigChange, LaunchContext, Tool
from locals.errors import LocalsError


@dataclass
class LaunchPlan:
    tool: Tool
    argv: list[str]
    env: dict[str, str]
    changes: list[ConfigChange] = field(default_factory=list)
    prepare: list[list[str]] = field(default_factory=list)


def check_runnable(tool: Tool) -> None:
    """Raise with the install command or the missing runtime when the tool cannot run."""
    found = tool.detect()
    if not found.installed:
        runtime = tool.runtime_problem()  # said now, not after the install fails to run
        also = f" ({tool.title} {runtime})" if runtime else ""
        raise LocalsError(f"{tool.title} is not installed; install it with `{tool.install}`{also}")
    if found.problem:
        raise LocalsError(f"{tool.title} {found.problem}; install a newer one, then try again")


def check_context(tool: Tool, ctx: LaunchContext, accepted_only: bool = False) -> None:
    """Raise when the served model's window is shorter than the tool accepts, or (unless
    `accepted_only`) too short for the tool's fixed first prompt with room for a reply (its first
    request would fail)."""
    if tool.min_context and ctx.context_length and ctx.context_length < tool.min_context:
        command = "setup" if accepted_only else "launch"  # `setup` checks only what the tool accepts
        raise LocalsError(
            f"{tool.title} needs a model with at least {tool.min_context:,} tokens of context; "
            f"{ctx.model} has {ctx.context_length:,}. Start locals with a larger model "
            f"(`locals {command} {tool.name} --model qwen`)"
        )
    window = ctx.context_window(tool.context_wanted)
    if not accepted_only and ctx.context_length and not ctx.first_prompt_fits(window, tool.first_prompt):
        raise LocalsError(
            f"{tool.title}'s first prompt alone (its instructions and tool definitions) is about "
            f"{tool.first_prompt:,} tokens; {ctx.model}'s {window:,}-token context leaves no room for a "
            f"reply after it. Start locals with a model with a longer context "
            f"(`locals launch {tool.name} --model qwen`)"
        )


def plan(tool: Tool, ctx: LaunchContext, args: list[str], base_env: dict[str, str] | None = None) -> LaunchPlan:
    env = dict(os.environ if base_env is None else base_env)
    for key, value in tool.env(ctx).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return LaunchPlan(tool, tool.command(ctx, list(args)), env, tool.configure(ctx), tool.prepare(ctx))


def apply_changes(tool: Tool, changes: list[ConfigChange]) -> list[tuple[Path, str]]:
    """Write each change with backup + manifest; returns (file, why) for the user."""
    for change in changes:  # all of them readable first: a broken file stops the setup before any write
        configfiles.check(change.path, change.fmt)
    done = []
    for change in changes:
        configfiles.apply(tool.name, change.path, change.values, change.fmt)
        done.append((change.path, change.why))
    return done


def execute(launch: LaunchPlan, cwd: Path) -> None:
    """Run the prep commands, then exec the tool (does not return on success)."""
    for argv in launch.prepare:
        result = subprocess.run(argv, env=launch.env, cwd=cwd, capture_output=True, text=True)
        if result.returncode != 0:
            raise LocalsError(f"`{' '.join(argv[:3])} …` failed: {(result.stderr or result.stdout).strip()[:300]}")
    os.chdir(cwd)
    try:
        os.execvpe(launch.argv[0], launch.argv, launch.env)
    except OSError as exc:
        raise LocalsError(f"cannot start {launch.argv[0]}: {exc.strerror}") from exc
