"""State-changing requests another site's page makes a browser send: refused (cross-site request forgery).

A page elsewhere can make a visitor's browser POST a form to this server (`text/plain` needs no CORS
preflight) and the browser adds what it holds for it: the viewer's session cookie (viewer/login.py;
SameSite=Strict keeps it from other sites, but a page on another port of the same host is the same
*site*), or nothing at all on a server without keys, which then forks, replays, erases or runs the
model for that page. So a request that is not a GET, HEAD or OPTIONS is refused (403, before its
key is checked) when the browser says another site sent it (`Sec-Fetch-Site: cross-site`) or when
its `Origin` is not the address it was sent to (its Host). A request with its key in a header
(`Authorization`, `x-api-key`, `x-goog-api-key`: what agents send) is let through: a page elsewhere
cannot set those without a preflight, which this server never grants (it answers no CORS at all).
"""

from __future__ import annotations

from aiohttp import web
from yarl import URL

from .errors import APIError

SAFE = frozenset({"GET", "HEAD", "OPTIONS"})  # what a browser may send anywhere: they change nothing here
KEY_HEADERS = ("Authorization", "x-api-key", "x-goog-api-key")
CROSS_SITE = "cross_site_request"


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


def from_another_site(request: web.Request) -> bool:
    if request.method in SAFE or any(name in request.headers for name in KEY_HEADERS):
        return False
    if request.headers.get("Sec-Fetch-Site", "").strip().lower() == "cross-site":
        return True
    origin = request.headers.get("Origin")
    return origin is not None and not _same_address(origin, request.headers.get("Host"))


@web.middleware
async def refuse_cross_site(request: web.Request, handler):
    if from_another_site(request):
        # Neither header is repeated: both are the client's text.
        raise APIError(403, "This request came from a page on another site (its Sec-Fetch-Site or Origin header "
                       "says so) and would change something here; it is refused. Send it from the viewer's own "
                       "page, or with the key in the Authorization header.", code=CROSS_SITE)
    return await handler(request)
