"""`GET /`: the dashboard page for browsers, and Ollama's "Ollama is running" for every other
client. The page is static/dashboard.html with its own stylesheet and scripts (charts drawn
as SVG by static/charts.js: nothing is fetched from elsewhere, so it works offline); it polls
/v1/locals/status, /history, /conversations and /team.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

ASSETS = {"dashboard.js": "text/javascript", "charts.js": "text/javascript", "dashboard.css": "text/css"}


def _static(name: str) -> bytes:
    return resources.files("locals.server").joinpath(f"static/{name}").read_bytes()


async def dashboard(request: web.Request) -> web.Response:
    return web.Response(body=_static("dashboard.html"), content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-cache"})


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return web.Response(body=_static(name), content_type=ASSETS[name], charset="utf-8",
                        headers={"Cache-Control": "no-cache"})


async def root(request: web.Request) -> web.Response:
    if "text/html" in request.headers.get("Accept", ""):
        return await dashboard(request)
    return web.Response(text="Ollama is running")


def register(app: web.Application) -> None:
    app.router.add_get("/", root)
    app.router.add_get("/dashboard", dashboard)
    app.router.add_get("/static/{name}", asset)
