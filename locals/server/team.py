"""What a `locals run` team is doing, as its runner reports it: `POST /v1/locals/team` takes the
run's whole state (parts, agents, their worktrees, steps, checks, the applied patch) and
`GET /v1/locals/team` gives the dashboard the last few runs.

The runner sends a full snapshot each time (no deltas), so a lost report costs nothing
and the board needs no order. Only this machine may report: the peer must be loopback,
even on a server started with --allow-remote. A body of the wrong shape is a 400 that
names the field.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from aiohttp import web

from locals.errors import RequestError
from locals.server.security import is_loopback
from locals.server.wire import get, read_json

KEEP_RUNS = 4
# A running team reports at least every 15 s (agents/report.py); silent this long, it is gone.
STALE_S = 60.0
STATES = ("planning", "running", "done", "stopped")

_RUN = {"task": (str, 2000), "directory": (str, 500), "check": (str, 500), "mode": (str, 20),
        "message": (str, 500), "started": (float, None), "max_steps": (int, None)}
_PART = {"index": (int, None), "goal": (str, 500), "status": (str, 40), "winner": (int, None),
         "files": (list, None), "detail": (str, 500), "patch": (str, 20_000)}
_AGENT = {"part": (int, None), "agent": (int, None), "worktree": (str, 200), "session": (str, 120),
          "step": (int, None), "action": (str, 200), "status": (str, 40), "check": (str, 300),
          "check_passed": (bool, None), "tokens": (int, None)}
_MAX_ITEMS = 256


def _fields(obj: Any, spec: dict, where: str) -> dict:
    """`obj`'s fields of `spec`, type-checked (RequestError naming `where`), strings clipped."""
    if not isinstance(obj, dict):
        raise RequestError(f"`{where}` must be an object")
    out = {}
    for key, (kind, limit) in spec.items():
        try:
            value = get(obj, key, kind)
        except RequestError as exc:
            raise RequestError(f"{where}: {exc}") from None
        if kind is list and value is not None:
            if not all(isinstance(v, str) for v in value):
                raise RequestError(f"{where}: `{key}` must be an array of strings")
            value = [v[:300] for v in value[:_MAX_ITEMS]]
        out[key] = value[:limit] if limit and isinstance(value, str) else value
    return out


def parse_report(body: dict) -> dict:
    """A run's snapshot as the board keeps it."""
    run = get(body, "run", str, required=True)
    if not run.strip() or len(run) > 64:
        raise RequestError("`run` must be a run id of 1 to 64 characters")
    state = get(body, "state", str, required=True)
    if state not in STATES:
        raise RequestError(f"`state` must be one of {', '.join(STATES)}, got {state[:40]!r}")
    lists = {}
    for key, spec in (("parts", _PART), ("agents", _AGENT)):
        items = get(body, key, list, [])
        if len(items) > _MAX_ITEMS:
            raise RequestError(f"`{key}` lists {len(items)} entries; at most {_MAX_ITEMS} are taken")
        lists[key] = [_fields(item, spec, f"{key}[{i}]") for i, item in enumerate(items)]
    return {"run": run, "state": state, **_fields(body, _RUN, "run"), **lists}


class TeamBoard:
    """The last KEEP_RUNS runs, the most recently reported first."""

    def __init__(self, keep: int = KEEP_RUNS):
        self.keep = keep
        self._runs: OrderedDict[str, dict] = OrderedDict()

    def report(self, snapshot: dict, now: float | None = None) -> None:
        self._runs.pop(snapshot["run"], None)
        self._runs[snapshot["run"]] = {**snapshot, "updated": time.time() if now is None else now}
        while len(self._runs) > self.keep:
            self._runs.popitem(last=False)

    def runs(self, now: float | None = None) -> list[dict]:
        now = time.time() if now is None else now
        out = []
        for run in reversed(self._runs.values()):
            live = run["state"] in ("planning", "running") and now - run["updated"] < STALE_S
            out.append({**run, "active": live})
        return out


TEAM = web.AppKey("locals_team", TeamBoard)


async def post_team(request: web.Request) -> web.Response:
    if not is_loopback(request.remote or ""):
        raise web.HTTPForbidden(reason="only a runner on this machine may report a team's progress")
    request.app[TEAM].report(parse_report(await read_json(request)))
    return web.json_response({"ok": True})


async def get_team(request: web.Request) -> web.Response:
    return web.json_response({"now": time.time(), "runs": request.app[TEAM].runs()})


def register(app: web.Application) -> None:
    app[TEAM] = TeamBoard()
    app.router.add_post("/v1/locals/team", post_team)
    app.router.add_get("/v1/locals/team", get_team)
