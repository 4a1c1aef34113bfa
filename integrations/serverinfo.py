"""What a running locals server serves: the model's name and context length, over HTTP.

/v1/models names the model ("locals/<name>"); the context length comes from that
entry when the server puts it there, else from Ollama's /api/show `model_info`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from locals.errors import DaemonNotRunning

_CONTEXT_KEYS = ("context_length", "max_model_len", "context_window", "max_context_length")


def _request(url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def served_model(base_url: str) -> tuple[str, int | None]:
    """(model name without the `locals/` prefix, context length or None)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        listing = _request(root + "/v1/models")
    except (OSError, ValueError) as exc:
        raise DaemonNotRunning(f"cannot read {root}/v1/models ({exc}); run `locals status`") from exc
    models = [m for m in (listing or {}).get("data", []) if isinstance(m, dict) and m.get("id")]
    if not models:
        raise DaemonNotRunning(f"{root}/v1/models lists no model; run `locals start --model …`")
    entry = models[0]
    name = entry["id"].removeprefix("locals/")
    context = next((int(entry[k]) for k in _CONTEXT_KEYS if isinstance(entry.get(k), int)), None)
    return name, context or _context_from_show(root, name)


def _context_from_show(root: str, name: str) -> int | None:
    try:
        shown = _request(root + "/api/show", {"model": name})
    except (OSError, ValueError):
        return None
    info = (shown or {}).get("model_info") or {}
    lengths = [v for k, v in info.items() if k.endswith(".context_length") and isinstance(v, int)]
    return lengths[0] if lengths else None
