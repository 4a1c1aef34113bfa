"""The dashboard in headless Chromium (Debian's `chromium` package): it shows the loaded
model and a request count that changes after a request."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request

import pytest

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--no-first-run", "--virtual-time-budget=5000"]
# The test process may run with OpenBLAS preloaded (tests/conftest.py re-execs with it);
# Chromium's GPU process dies with that preload ("GPU process isn't usable"), so drop it.
CHROMIUM_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def rendered_dom(url: str, profile) -> str:
    """The page's DOM after its scripts ran (virtual time lets the first poll complete)."""
    done = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120, env=CHROMIUM_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def field(dom: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert match, f"no #{element_id} in the dashboard"
    return match.group(1)


def render_until(url: str, profile, ready) -> str:
    """Render until `ready(dom)` holds (a few tries): on a busy machine the page's first poll
    may not land within Chromium's virtual-time budget."""
    for _ in range(5):
        dom = rendered_dom(url, profile)
        if ready(dom):
            break
    return dom


def _count(dom: str) -> int:
    text = field(dom, "requests-total").strip()
    return int(text) if text.isdigit() else -1


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_dashboard_shows_model_and_counts_requests(locals_server, tmp_path):
    url, profile = locals_server.url + "/", tmp_path / "profile"
    dom = render_until(url, profile, lambda d: 'id="model"' in d and field(d, "model") == "smollm2"
                       and _count(d) >= 0)
    assert field(dom, "model") == "smollm2"
    assert field(dom, "status") == "ready"
    before = _count(dom)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}).encode()
    request = urllib.request.Request(locals_server.openai_url + "/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        assert resp.status == 200
    dom = render_until(url, profile, lambda d: 'id="requests-total"' in d and _count(d) > before)
    assert _count(dom) >= before + 1
    assert "<td>openai</td>" in dom  # the recent-requests table lists it
