"""The team runner behind `locals run`: planner, agents in git worktrees, sandbox, check.

Talks to a model server over HTTP only (locals.client); imports nothing else of locals
but config, protocol and errors.
"""
