"""`GET /metrics`: the server's counters and gauges in Prometheus text exposition format."""

from __future__ import annotations

from aiohttp import web

from locals.server.status import snapshot
from locals.server.state import state_of

# (metric, type, help, key in EngineStats)
_ENGINE = [
    ("locals_requests_running", "gauge", "Requests decoding now", "running"),
    ("locals_requests_waiting", "gauge", "Requests queued for a slot", "waiting"),
    ("locals_requests_prefilling", "gauge", "Requests reading their prompt", "prefilling"),
    ("locals_prompt_tokens_total", "counter", "Prompt tokens received", "prompt_tokens_total"),
    ("locals_generated_tokens_total", "counter", "Tokens generated", "generated_tokens_total"),
    ("locals_cached_tokens_total", "counter", "Prompt tokens served from the prefix cache",
     "cached_tokens_total"),
    ("locals_decode_tokens_per_second", "gauge", "Recent decode throughput", "decode_tokens_per_s"),
    ("locals_prefill_tokens_per_second", "gauge", "Recent prompt throughput", "prefill_tokens_per_s"),
    ("locals_last_ttft_seconds", "gauge", "Time to first token of the last request", "last_ttft_s"),
    ("locals_kv_bytes", "gauge", "Bytes held by KV caches", "kv_bytes"),
    ("locals_kv_budget_bytes", "gauge", "KV memory budget", "kv_budget_bytes"),
    ("locals_weights_bytes", "gauge", "Bytes of model weights", "weights_bytes"),
    ("locals_engine_steps_total", "counter", "Engine steps run", "steps"),
]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """A sample value in full: counters past a million keep every digit (`:g` would round them)."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def render(snap: dict) -> str:
    lines = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        lines.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)

    model = f'{{model="{_escape(str(snap["model"]))}"}}'
    metric("locals_up", "gauge", "1 when the model is loaded and serving",
           [(model, 1 if snap["status"] == "ready" else 0)])
    metric("locals_uptime_seconds", "gauge", "Seconds since the server started", [("", snap["uptime_s"])])
    metric("locals_resident_memory_bytes", "gauge", "Resident memory of the server process",
           [("", snap["memory_rss_bytes"])])
    engine = snap.get("engine")
    if engine:
        for name, kind, help_text, key in _ENGINE:
            metric(name, kind, help_text, [("", engine.get(key) or 0)])
        reqs = snap["requests"]
        metric("locals_http_requests_in_flight", "gauge", "Generation requests being answered",
               [("", reqs["in_flight"])])
        metric("locals_http_requests_total", "counter", "Generation requests answered, by API and outcome",
               [(f'{{api="{_escape(r["api"])}",finish="{_escape(r["finish"])}"}}', r["count"])
                for r in reqs["by_outcome"]])
    return "\n".join(lines) + "\n"


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=render(snapshot(state_of(request))).encode(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def register(app: web.Application) -> None:
    app.router.add_get("/metrics", metrics)
