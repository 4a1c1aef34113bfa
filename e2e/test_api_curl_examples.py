"""The curl examples in docs/serve.md run as written (port swapped for the test daemon's)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[1] / "docs" / "serve.md"
EXAMPLES = [block for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.DOTALL)
            if block.startswith("curl")]


def test_there_are_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("command", EXAMPLES, ids=[f"example{i}" for i in range(len(EXAMPLES))])
def test_curl_example(locals_server, command):
    done = subprocess.run(["bash", "-c", command.replace(":8321", f":{locals_server.port}")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    if out.startswith("{"):
        body = json.loads(out)
        assert body.get("error") is None, body
    else:  # a stream
        assert out.startswith("data: ") and out.endswith("data: [DONE]")
