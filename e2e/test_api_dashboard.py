"""The dashboard in headless Chromium (Debian's `chromium` package) on the real daemon: the
loaded model and a request count that moves; then, under live traffic from several
clients, charts drawn from the server's history, the conversations per client, and during
a `locals run` the team view. Each stage saves a screenshot (idle.png, load.png, run.png
in the test's tmp dir; `--basetemp DIR` keeps them where you want, e.g. to refresh
docs/images/dashboard-*.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from itertools import count

import pytest

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--virtual-time-budget=5000"]
# The test process may run with OpenBLAS preloaded (tests/conftest.py re-execs with it);
# Chromium's GPU process dies with that preload ("GPU process isn't usable"), so drop it.
CHROMIUM_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
_profiles = count()


def chromium(args: list[str], tmp_path) -> str:
    """Run Chromium once with a fresh profile; its stdout."""
    profile = tmp_path / f"profile-{next(_profiles)}"
    done = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=180, env=CHROMIUM_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def rendered_dom(url: str, tmp_path) -> str:
    """The page's DOM after its scripts ran (virtual time lets the first polls complete)."""
    return chromium(["--dump-dom", url], tmp_path)


def screenshot(url: str, tmp_path, name: str, height: int) -> None:
    path = tmp_path / name
    chromium([f"--screenshot={path}", f"--window-size=1440,{height}", url], tmp_path)
    assert path.stat().st_size > 20_000  # a drawn page, not a blank one
    print(f"dashboard screenshot: {path}")


def field(dom: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert match, f"no #{element_id} in the dashboard"
    return match.group(1)


def render_until(url: str, tmp_path, ready) -> str:
    """Render until `ready(dom)` holds (a few tries): on a busy machine the page's first poll
    may not land within Chromium's virtual-time budget."""
    for _ in range(5):
        dom = rendered_dom(url, tmp_path)
        if ready(dom):
            break
    return dom


def _count(dom: str) -> int:
    text = field(dom, "requests-total").strip()
    return int(text) if text.isdigit() else -1


def post(url: str, body: dict, headers: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=300) as resp:
        return json.loads(resp.read())


@needs_chromium
def test_dashboard_shows_model_and_counts_requests(locals_server, tmp_path):
    url = locals_server.url + "/"
    dom = render_until(url, tmp_path, lambda d: 'id="model"' in d and field(d, "model") == "smollm2"
                       and _count(d) >= 0)
    assert field(dom, "model") == "smollm2"
    assert field(dom, "status") == "ready"
    before = _count(dom)
    post(locals_server.openai_url + "/chat/completions",
         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}, {})
    dom = render_until(url, tmp_path, lambda d: 'id="requests-total"' in d and _count(d) > before)
    assert _count(dom) >= before + 1
    assert "<td>openai</td>" in dom  # the recent-requests table lists it


SYSTEM = ("You are a careful coding agent working in a Python repository. Read before you write, keep "
          "changes small, run the tests after each change, and explain what you did in one sentence. ") * 6
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file of the project",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
# (User-Agent, session headers, API, first user message): what real agent clients send.
CLIENTS = [
    ("opencode/0.9.1", {"X-Session-Id": "ses_7f3a2c"}, "openai", "Add a --verbose flag to the CLI."),
    ("claude-cli/1.0.83 (external, cli)", {"X-Claude-Code-Session-Id": "c0ffee42-9e1d"}, "anthropic",
     "Why does test_parse fail on Windows paths?"),
    ("aider/0.86.1", {}, "openai", "Rename parse_args to read_options everywhere."),
    ("codex_cli_rs/0.41.0", {"session_id": "0199a1f3-codex"}, "tools", "Find where the config file is read."),
]


class Traffic:
    """Each client runs a conversation that grows a turn at a time until stopped."""

    def __init__(self, server):
        self.server = server
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.turns = 0
        self.threads = [threading.Thread(target=self._client, args=c, daemon=True) for c in CLIENTS]

    def __enter__(self) -> "Traffic":
        for thread in self.threads:
            thread.start()
            time.sleep(1.5)  # staggered arrivals, as agents come and go
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=300)

    def _client(self, agent: str, headers: dict, api: str, first: str) -> None:
        headers = {"User-Agent": agent, **headers}
        messages = [{"role": "user", "content": first}]
        while not self.stop.is_set():
            try:
                reply = self._turn(api, headers, messages)
            except Exception as exc:  # reported by the test, which fails on any
                self.errors.append(f"{agent}: {exc}")
                return
            messages += [{"role": "assistant", "content": reply or "ok"},
                         {"role": "user", "content": f"Good. Now step {len(messages) // 2 + 1}: go on."}]
            self.turns += 1
            time.sleep(0.5)  # think time between turns

    def _turn(self, api: str, headers: dict, messages: list[dict]) -> str:
        if api == "anthropic":
            body = post(self.server.url + "/v1/messages",
                        {"model": "smollm2", "system": SYSTEM, "messages": messages, "max_tokens": 24}, headers)
            return "".join(block.get("text", "") for block in body["content"])
        body = {"model": "smollm2", "messages": [{"role": "system", "content": SYSTEM}, *messages], "max_tokens": 24}
        if api == "tools":  # a call needs room: the shortest valid one is 28 tokens here
            body |= {"tools": TOOLS, "tool_choice": "required", "max_tokens": 64}
        reply = post(self.server.openai_url + "/chat/completions", body, headers)["choices"][0]["message"]
        return reply.get("content") or json.dumps(reply.get("tool_calls"))


def chart_points(dom: str, chart_id: str, series: str) -> list[tuple[float, float]]:
    """The points of a series' lines in one chart of the rendered page."""
    figure = dom[dom.index(f'id="{chart_id}"'):]
    figure = figure[:figure.index("</figure>")]
    out = []
    for match in re.finditer(rf'<polyline points="([^"]+)"[^>]*data-series="{series}"', figure):
        out += [tuple(map(float, p.split(","))) for p in match.group(1).split()]
    return out


def _team_midway(server) -> bool:
    """An agent has taken two steps or been checked: the team view has something to show."""
    runs = server.get_json("/v1/locals/team")["runs"]
    return bool(runs) and any(a["step"] >= 2 or a["check"] for a in runs[0]["agents"])


def _git_project(project):
    """A one-commit git project for `locals run`."""
    project.mkdir()
    (project / "README.md").write_text("# my project\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"]):
        subprocess.run(["git", *args], cwd=project, check=True)
    return project


@needs_chromium
def test_dashboard_under_load_and_during_a_team_run(locals_server, tmp_path):
    url = locals_server.url + "/"
    dom = render_until(url, tmp_path, lambda d: field(d, "status") == "ready")
    assert 'id="chart-decode"' in dom and "<line" in dom  # the axes are drawn before any traffic
    screenshot(url, tmp_path, "idle.png", 940)

    with Traffic(locals_server) as traffic:
        deadline = time.monotonic() + 240
        while traffic.turns < 12 and time.monotonic() < deadline and not traffic.errors:
            time.sleep(1)
        dom = render_until(url + "?window=60", tmp_path,
                           lambda d: len(chart_points(d, "chart-decode", "decode")) >= 10)
        screenshot(url + "?window=60", tmp_path, "load.png", 1420)
    assert not traffic.errors, traffic.errors
    decode = chart_points(dom, "chart-decode", "decode")
    assert len(decode) >= 10 and len({y for _, y in decode}) > 1  # a line that moves, from the history
    assert chart_points(dom, "chart-requests", "running")
    assert re.search(r'data-series="ttft"', dom)  # TTFT dots
    table = dom[dom.index('id="conversations"'):]
    for agent in ("opencode/0.9.1", "claude-cli/1.0.83", "aider/0.86.1", "codex_cli_rs/0.41.0"):
        assert f"<td>{agent}</td>" in table, agent
    assert "session ses_7f3a2c" in table and "opening " in table  # a session, and aider's prefix identity
    rows = {r["client"]: r for r in locals_server.get_json("/v1/locals/conversations")["conversations"]}
    assert rows["aider/0.86.1"]["requests"] >= 2 and rows["aider/0.86.1"]["cache_hit"] > 0
    assert rows["codex_cli_rs/0.41.0"]["tool_calls"] >= 1

    if shutil.which("bwrap") is None and sys.platform == "linux":
        pytest.skip("the team view needs `locals run`, which needs bubblewrap (apt-get install bubblewrap)")
    project = _git_project(tmp_path / "my-project")
    # A task the 135M model can pass now and then, so that the view may show an applied patch.
    run = subprocess.Popen(
        [sys.executable, "-m", "locals", "run", "Write a file notes.txt that says hello.", "--dir", str(project),
         "--check", "grep -qi hello notes.txt", "--port", str(locals_server.port), "--agents", "2",
         "--max-steps", "3", "--max-tokens", "160", "--timeout", "420", "--json"],
        env=locals_server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not _team_midway(locals_server) and time.monotonic() < deadline and run.poll() is None:
            time.sleep(1)
        dom = render_until(url, tmp_path, lambda d: 'id="team" hidden' not in d and "p1-a2" in d)
        screenshot(url, tmp_path, "run.png", 1300)
        out, err = run.communicate(timeout=480)
    finally:
        run.kill()
    assert run.returncode in (0, 1), err
    team = dom[dom.index('id="team"'):dom.index('id="conversations"')]
    assert "Write a file notes.txt" in team and "<code>p1-a1</code>" in team and "<code>p1-a2</code>" in team
    assert "grep -qi hello notes.txt" in team
    board = locals_server.get_json("/v1/locals/team")["runs"][0]
    assert board["state"] == "done", err[-3000:]  # "stopped": the run ended without its outcome
    assert board["message"] == json.loads(out)["message"]
    dom = render_until(url, tmp_path, lambda d: board["run"] in d and 'class="pill">running<' not in d)
    screenshot(url, tmp_path, "run-done.png", 1300)
    if board["parts"][0]["status"] == "applied":  # the patch the project got is on the page
        assert "+++ b/notes.txt" in dom and "applied by agent" in dom
    sessions = {r["session"] for r in locals_server.get_json("/v1/locals/conversations")["conversations"]}
    assert {f"{board['run']}/p1-a1", f"{board['run']}/p1-a2"} <= sessions  # each agent is a conversation
