"""Agent sessions from the store: GET /v1/sessions, GET /v1/sessions/{key}, and GET /v1/live, the
stream of requests as they are stored, for pages that watch an agent run."""

from __future__ import annotations

import asyncio
import re

from aiohttp import web

from looptrace.common.jsonio import dumps

from ..auth import CACHE_SECONDS, GUARD, sees
from ..cross_site import streamed_to_pages
from ..errors import APIError, invalid
from ..keys import TELEMETRY
from ..query import Cursor, Query, Time, between
from ..stored import on_viewer_thread, read, store_of
from ..streaming import KEEPALIVE_SECONDS, SSE_HEADERS

EMPTY = {"data": [], "next": None, "models": [], "clients": []}


class SessionsQuery(Query):
    before: Cursor = None
    model: str = ""
    client: str = ""
    since: Time = None
    until: Time = None
    q: str = ""
    group: str | None = None
    limit: between(1, 500) = 50


async def list_sessions(request: web.Request) -> web.Response:
    """Sessions, most recently active first. ?model= &client= &since= &until= &q= (a conversation id or
    words a step read or wrote) &group= (a rollout group's) &limit= &before= (the `next` of the page before)."""
    query = SessionsQuery.of(request)
    keys = await group_keys(request, query.group)
    page = await read(store_of(request).list_sessions, EMPTY, keys=keys, model=query.model or None,
                      client=query.client or None, since_ns=query.since, until_ns=query.until,
                      text=search_text(query.q), before=query.before, limit=query.limit, tenant=sees(request))
    return web.json_response({"object": "list", **page}, dumps=dumps)


MAX_GROUP_SESSIONS = 10_000


async def group_keys(request: web.Request, group: str | None) -> list[str] | None:
    """?group=: the sessions of a rollout group (X-Rollout-Group), or None for all."""
    rollouts = request.app[TELEMETRY].rollouts
    if not group or rollouts is None:
        return None
    found = await on_viewer_thread(rollouts.in_group, group, MAX_GROUP_SESSIONS, sees(request))
    return [r["rollout"] for r in found]


# A search is a conversation id or a few words: far past either, it only costs the store's time (a 60 KB
# phrase took seconds, eight of them half a minute).
MAX_SEARCH_CHARS = 256
MAX_SEARCH_WORDS = 16
_WORD = re.compile(r"\w+")  # about what the full-text index's tokenizer (unicode61) takes as a word


def search_text(value: str) -> str | None:
    """`?q=`, checked: None when empty; a 400 past its bounds or with a NUL (which no store takes)."""
    text = value.strip()
    if "\x00" in text:
        raise invalid("'q' must not hold a NUL character.", param="q")
    if len(text) > MAX_SEARCH_CHARS:
        raise invalid(f"'q' is {len(text):,} characters; a search takes at most {MAX_SEARCH_CHARS}.", param="q")
    if len(_WORD.findall(text)) > MAX_SEARCH_WORDS:
        raise invalid(f"'q' holds more than {MAX_SEARCH_WORDS} words; a search takes at most {MAX_SEARCH_WORDS}.",
                      param="q")
    return text or None


class SessionKey(Query):
    key: str = ""  # for a key that is "." or "..", which no path can hold


class SessionQuery(SessionKey):
    offset: between(0, 1 << 31) = 0
    limit: between(1, 10_000) | None = None  # all of them


def session_key(request: web.Request, given: str, route: str = "/v1/sessions/{key}") -> str:
    """The session a route names: in its path (`route`), or as ?key= (`given`) where a path cannot say it."""
    key = request.match_info.get("key") or given
    if not key:
        raise invalid(f"Name the session: {route}, or /v1/sessions/?key=KEY.", param="key")
    return key


async def get_session(request: web.Request) -> web.Response:
    """GET /v1/sessions/{key}, or /v1/sessions/?key=KEY for a key that is "." or "..", which clients
    resolve as a step up the path however it is escaped. ?offset= &limit=: a page of its steps (all of
    them by default; `steps_total` says how many there are)."""
    query = SessionQuery.of(request)
    key = session_key(request, query.key)
    found = await read(store_of(request).session, None, key, query.offset, query.limit, sees(request))
    if found is None:
        raise APIError(404, "No such session in the store (it may not be written yet, or was retired).",
                       param="key", code="session_not_found")
    return web.json_response(found, dumps=dumps)


RECHECK_SECONDS = CACHE_SECONDS  # how often an open feed asks again whether its caller may still read


@streamed_to_pages  # a page on another origin may not open it (cross_site.py)
async def live(request: web.Request) -> web.StreamResponse:
    """Server-sent events: `data:` a stored step (its `session` says where it belongs) for every
    request as it is stored; `event: gap` when this client fell behind and should reload.

    The caller is asked for again every RECHECK_SECONDS, as a new request's would be (auth.py, from a
    cache of CACHE_SECONDS): a feed opened with the viewer's cookie ends within a second of its logout
    or expiry, one opened with a key within a second of the key's revoking, on every worker, with
    `event: ended` and the refusal (in the API's error shape) that a new feed would get."""
    store_of(request)  # a 404 when there is no store to watch
    feed = request.app[TELEMETRY].feed
    tenant = sees(request)
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    loop = asyncio.get_running_loop()
    async with feed.subscribe() as queue:
        try:
            await response.write(b": watching\n\n")
            quiet_since = loop.time()
            while True:
                try:
                    batch = await asyncio.wait_for(queue.get(), RECHECK_SECONDS)
                except TimeoutError:
                    batch = ()
                if (refused := await _refused(request)) is not None:
                    await response.write(b"event: ended\ndata: " + dumps(refused.body()).encode() + b"\n\n")
                    return response
                if batch is None:
                    await response.write(b"event: gap\ndata: {}\n\n")
                    quiet_since = loop.time()
                    continue
                shown = [step for step in batch if tenant is None or step.get("tenant") == tenant]
                if shown:
                    await response.write(b"".join(f"data: {dumps(step)}\n\n".encode() for step in shown))
                    quiet_since = loop.time()
                elif loop.time() - quiet_since >= KEEPALIVE_SECONDS:
                    await response.write(b": keepalive\n\n")
                    quiet_since = loop.time()
        except ConnectionError:
            return response  # the page went away


async def _refused(request: web.Request) -> APIError | None:
    """Why the feed's caller may no longer read it (its login ended, its key was revoked), or None."""
    try:
        await request.app[GUARD].caller(request)
    except APIError as refused:
        return refused
    return None
