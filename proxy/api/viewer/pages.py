"""The trace viewer: one page (static/index.html and its scripts), served at `/`, `/sessions/{key}`
and `/traces/{trace_id}`, so that a link from Grafana or a colleague opens that view.

The page is public (a browser cannot send a key for it); the data it reads under /v1 needs the key
when one is set, which the page asks for and sends as a header, never in a URL. Everything it shows
came from a model or a client, so its Content-Security-Policy runs only this server's scripts and
styles, fetches only from this server, and can be framed by nobody.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).resolve().parent / "static"
# /sessions/?key=KEY: a session whose key is "." or "..", which no browser keeps in a path (static/api.js).
PAGES = ("/", "/sessions/", "/sessions/{key:.+}", "/traces/{trace_id}")
# Two sessions side by side (static/compare.html): /compare/KEY_A/KEY_B, each key percent-encoded, or
# /compare?a=KEY_A&b=KEY_B for keys no path keeps ("." and "..").
COMPARE_PAGES = ("/compare", "/compare/{keys:.+}")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


async def page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


async def compare_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "compare.html", headers={"Cache-Control": "no-cache"})


@web.middleware
async def security_headers(request: web.Request, handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    if not request.path.startswith("/v1/"):
        response.headers["Content-Security-Policy"] = CSP
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Frame-Options"] = "DENY"
    return response
