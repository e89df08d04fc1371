"""Media given by URL, fetched only from the domains `--allowed-media-domains` lists (vLLM's flag).

A server that fetches what clients name is a way into whatever it can reach: nothing is fetched
unless its host is listed, only over http(s), within `--media-max-mb` and `--media-fetch-timeout`,
with no redirect followed. The connection goes only to addresses checked when the name is resolved
(the resolver below), so a listed name cannot be pointed at a loopback, private or link-local
address (DNS rebinding) unless that address, or `localhost`, is itself what was listed.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from looptrace.families.media.parts import MediaLimits, MediaPart
from looptrace.families.media.plan import MediaPlan

from .errors import invalid


def allowed_host(url: str, allowed: frozenset[str]) -> str | None:
    """The URL's host when it is http(s) and listed (case-insensitive, exactly: no subdomains), else None."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    return host if parts.scheme in ("http", "https") and host in allowed else None


def public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_global and not ip.is_multicast


class _CheckedResolver(AbstractResolver):
    """Resolves as usual, then keeps only public addresses, unless the host was listed as itself
    (an IP literal, or `localhost`)."""

    def __init__(self, allowed: frozenset[str]) -> None:
        self._inner = DefaultResolver()
        self._allowed = allowed

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list:
        found = await self._inner.resolve(host, port, family)
        literal = host.lower() in self._allowed and (host.lower() == "localhost" or _is_ip(host))
        kept = [a for a in found if literal or public(a["host"])]
        if not kept:
            raise OSError(f"{host} resolves only to addresses that are not public")
        return kept

    async def close(self) -> None:
        await self._inner.close()


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


async def fetch_media(plan: MediaPlan, allowed: frozenset[str], limits: MediaLimits, timeout: float) -> None:
    """Fills in the bytes of every part given by URL (`MediaPart.url`), or refuses the request (400)
    naming the part."""
    pending = plan.to_fetch()
    if not pending:
        return
    for part in pending:
        if allowed_host(part.url, allowed) is None:
            host = urlsplit(part.url).hostname or "?"
            listed = ", ".join(sorted(allowed)) or "none"
            raise invalid(f"'{part.param}': this server fetches media only from the hosts --allowed-media-domains "
                          f"lists ({listed}), not {host[:100]!r}; send it as a data URL.", param=part.param,
                          code="media_unsupported")
    connector = aiohttp.TCPConnector(resolver=_CheckedResolver(allowed), limit=4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        for part in pending:
            await _fetch(session, part, limits)


async def _fetch(session: aiohttp.ClientSession, part: MediaPart, limits: MediaLimits) -> None:
    try:
        async with session.get(part.url, allow_redirects=False) as response:
            if response.status != 200:
                raise invalid(f"'{part.param}': fetching it answered HTTP {response.status}"
                              + (" (redirects are not followed)" if 300 <= response.status < 400 else "") + ".",
                              param=part.param, code="media_fetch_failed")
            data = bytearray()
            async for chunk in response.content.iter_chunked(1 << 16):
                data += chunk
                if len(data) > limits.max_bytes:
                    raise invalid(f"'{part.param}' is more than {limits.max_bytes:,} bytes (--media-max-mb).",
                                  param=part.param, code="media_too_large")
            mime = response.content_type.lower()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        why = "no answer in time" if isinstance(exc, TimeoutError) else str(exc) or "the connection failed"
        raise invalid(f"'{part.param}' could not be fetched ({why}).", param=part.param,
                      code="media_fetch_failed") from exc
    kind = mime.split("/", 1)[0]
    if kind != part.kind:
        raise invalid(f"'{part.param}' was served as {mime or 'no type'}, not as {part.kind}.", param=part.param,
                      code="invalid_media")
    part.raw, part.mime = bytes(data), mime
