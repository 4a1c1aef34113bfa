"""`locals launch ollama`: locals answers on Ollama's port, so Ollama apps keep working.

Nothing is exec'd: the daemon is started on 11434. If another server (Ollama itself)
already answers there, the user is told to quit it first.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from integrations.base import Detection, LaunchContext, Tool, register
from locals.config import DEFAULT_HOST, OLLAMA_PORT
from locals.errors import LocalsError


def foreign_server(port: int = OLLAMA_PORT, host: str = DEFAULT_HOST) -> bool:
    """True when something that is not locals answers on the port."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/v1/models", timeout=3) as resp:
            data = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError:
        return True  # it speaks HTTP but not our /v1/models
    except (OSError, ValueError):
        return _port_open(host, port)
    ids = [m.get("id", "") for m in data.get("data", []) if isinstance(m, dict)]
    return not any(i.startswith("locals/") for i in ids)


def _port_open(host: str, port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


@register
class Ollama(Tool):
    name = "ollama"
    title = "Ollama apps (Open WebUI, Raycast, the ollama command)"
    executable = None
    launches = False
    port = OLLAMA_PORT

    def detect(self) -> Detection:
        return Detection(True, None, None, None)

    def check_port(self) -> None:
        if foreign_server(self.port):
            raise LocalsError(
                f"another server (probably Ollama) answers on port {self.port}; quit it first "
                "(`osascript -e 'quit app \"Ollama\"'`, `brew services stop ollama` or "
                "`systemctl stop ollama`), then run `locals launch ollama` again"
            )

    def settings(self, ctx: LaunchContext) -> dict[str, str]:
        return {"Ollama URL": ctx.base_url, "Model": "any name; the loaded model answers"}
