"""Requests another site's page makes a browser send: refused (cross-site request forgery, cross-site
WebSocket hijacking).

A page elsewhere can make a visitor's browser POST a form to this server (`text/plain` needs no CORS
preflight) and the browser adds what it holds for it: the viewer's session cookie (viewer/login.py;
SameSite=Strict keeps it from other sites, but a page on another port of the same host is the same
*site*), or nothing at all on a server without keys, which then forks, replays, erases or runs the
model for that page. So a request that is not a GET, HEAD or OPTIONS is refused (403, before its
key is checked) when the browser says another site sent it (`Sec-Fetch-Site: cross-site`) or when
its `Origin` is not the address it was sent to (its Host). A request with its key in a header
(`Authorization`, `x-api-key`, `x-goog-api-key`: what agents send) is let through: a page elsewhere
cannot set those without a preflight, which this server never grants (it answers no CORS at all).

A WebSocket handshake is a GET, and no same-origin rule binds it: a page anywhere may open
`ws://127.0.0.1:8000/v1/responses` and read every message, the browser adding the cookies and cached
credentials it holds for the host, and no CORS answer is asked for. A stream a page holds open (the
viewer's live feed, `streamed_to_pages`) is the other long read a page elsewhere could start with the
visitor's cookie. So every WebSocket upgrade, on any route, and every such stream is refused the same
way when it comes from another origin (its Origin, or `Sec-Fetch-Site: cross-site` or `same-site`: a
`no-cors` fetch sends no Origin), whatever it carries (a page cannot add a key header to a
WebSocket, but a browser adds a cached `Authorization: Basic` by itself). A client that is not a
browser (codex, the SDKs, `websockets`, curl) sends no `Origin`, and the viewer's own page sends its
own or none: both go on.
"""

from __future__ import annotations

from aiohttp import web
from yarl import URL

from .errors import APIError

SAFE = frozenset({"GET", "HEAD", "OPTIONS"})  # what a browser may send anywhere: they change nothing here
KEY_HEADERS = ("Authorization", "x-api-key", "x-goog-api-key")
CROSS_SITE = "cross_site_request"
_PAGE_STREAM = "__looptrace_page_stream__"


def streamed_to_pages(handler):
    """Marks a GET handler whose answer a page holds open (server-sent events read with the viewer's
    cookie): refused from another origin as a WebSocket upgrade is."""
    setattr(handler, _PAGE_STREAM, True)
    return handler


def _same_address(origin: str, host: str | None) -> bool:
    """Whether `Origin` names the host and port of the `Host` the request was sent to (yarl parses
    both, and gives each scheme's default port where none is written). `Origin: null` (a sandboxed
    frame, a redirect from elsewhere) names none."""
    try:
        sent_from = URL(origin)
        if not sent_from.absolute or sent_from.scheme not in ("http", "https") or not host:
            return False
        sent_to = URL.build(scheme=sent_from.scheme, authority=host)
    except ValueError:
        return False
    return (sent_from.host, sent_from.port) == (sent_to.host, sent_to.port)


def _fetch_site(request: web.Request) -> str:
    """What the browser says of who sent it (`Sec-Fetch-Site`): "cross-site", "same-site", … or ""."""
    return request.headers.get("Sec-Fetch-Site", "").strip().lower()


def _sent_from_elsewhere(request: web.Request) -> bool:
    """The browser says another site sent it, or its Origin is not the address it was sent to."""
    if _fetch_site(request) == "cross-site":
        return True
    origin = request.headers.get("Origin")
    return origin is not None and not _same_address(origin, request.headers.get("Host"))


def _opened_elsewhere(request: web.Request) -> bool:
    """As `_sent_from_elsewhere`, and also a page of another origin of the same site (another port of the
    host: `Sec-Fetch-Site: same-site`), which a fetch in `no-cors` mode sends without an Origin. The
    viewer's own page says `same-origin`; an address typed in, `none`."""
    if _fetch_site(request) == "same-site":
        return True
    return _sent_from_elsewhere(request)


def is_websocket_upgrade(request: web.Request) -> bool:
    """A WebSocket handshake, on whichever route (aiohttp's own test is narrower: `Upgrade: websocket`)."""
    return "websocket" in request.headers.get("Upgrade", "").lower()


def is_page_stream(request: web.Request) -> bool:
    return getattr(request.match_info.handler, _PAGE_STREAM, False)


def opened_from_another_site(request: web.Request) -> bool:
    """A WebSocket, or a stream the viewer's page reads, opened by a page of another origin."""
    return (is_websocket_upgrade(request) or is_page_stream(request)) and _opened_elsewhere(request)


def from_another_site(request: web.Request) -> bool:
    """A state-changing request another site's page sent (no key in a header)."""
    if request.method in SAFE or any(name in request.headers for name in KEY_HEADERS):
        return False
    return _sent_from_elsewhere(request)


@web.middleware
async def refuse_cross_site(request: web.Request, handler):
    # Neither header is repeated in an answer: both are the client's text.
    if opened_from_another_site(request):
        raise APIError(403, "This WebSocket or stream was opened by a page on another site (its Origin or "
                       "Sec-Fetch-Site header says so); it is refused. Open it from the viewer's own page, or "
                       "from a client that is not a browser (those send no Origin).", code=CROSS_SITE)
    if from_another_site(request):
        raise APIError(403, "This request came from a page on another site (its Sec-Fetch-Site or Origin header "
                       "says so) and would change something here; it is refused. Send it from the viewer's own "
                       "page, or with the key in the Authorization header.", code=CROSS_SITE)
    return await handler(request)
