"""A real locals daemon as e2e tests reach it: the embedded model's name, and `LocalsServer`
(port, home, the environment that reaches it, its CLI and JSON endpoints)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MODEL = "smollm2"
START_TIMEOUT_S = 600


@dataclass
class LocalsServer:
    """A running daemon and how to reach it."""

    port: int
    home: Path
    env: dict

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"

    def cli(self, *args: str, timeout: float = START_TIMEOUT_S, cwd: Path | None = None) -> subprocess.CompletedProcess:
        """Run `locals ARGS` against this daemon's home, from `cwd`, as the `locals` script does (no
        folder of the caller's on the module path); output captured as text."""
        return subprocess.run([sys.executable, "-P", "-m", "locals", *args], env=self.env, text=True,
                              capture_output=True, timeout=timeout, cwd=cwd)

    def get_json(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=30) as resp:
            return json.loads(resp.read())
