"""The dashboard in headless Chromium (Debian's `chromium` package): it shows the loaded
model and a request count that changes after a request."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request

import pytest

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def rendered_dom(url: str, profile) -> str:
    """The page's DOM after its scripts ran (virtual time lets the first poll complete)."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def field(dom: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert match, f"no #{element_id} in the dashboard"
    return match.group(1)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_dashboard_shows_model_and_counts_requests(locals_server, tmp_path):
    dom = rendered_dom(locals_server.url + "/", tmp_path / "profile")
    assert field(dom, "model") == "smollm2"
    assert field(dom, "status") == "ready"
    before = int(field(dom, "requests-total") or 0)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}).encode()
    request = urllib.request.Request(locals_server.openai_url + "/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        assert resp.status == 200
    # On a loaded machine the page's first poll may not have landed within the virtual-time
    # budget: render again (a few times at most) until the count has moved.
    for _ in range(4):
        dom = rendered_dom(locals_server.url + "/", tmp_path / "profile")
        if int(field(dom, "requests-total") or 0) > before:
            break
    assert int(field(dom, "requests-total")) >= before + 1
    assert "<td>openai</td>" in dom  # the recent-requests table lists it
