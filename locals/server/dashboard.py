"""`GET /`: the dashboard page for browsers (one self-contained HTML file polling
/v1/locals/status), and Ollama's "Ollama is running" for every other client.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web


def _page() -> bytes:
    return resources.files("locals.server").joinpath("static/dashboard.html").read_bytes()


async def dashboard(request: web.Request) -> web.Response:
    return web.Response(body=_page(), content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-cache"})


async def root(request: web.Request) -> web.Response:
    if "text/html" in request.headers.get("Accept", ""):
        return await dashboard(request)
    return web.Response(text="Ollama is running")


def register(app: web.Application) -> None:
    app.router.add_get("/", root)
    app.router.add_get("/dashboard", dashboard)
