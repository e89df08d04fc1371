"""The Host names this server answers: DNS rebinding shut out.

A page on another site can point a name it controls (`evil.example`) at 127.0.0.1 and then read
this server with the browser's own same-origin rights: every trace, prompt and tool output. The one
thing such a request cannot forge is its Host header, which carries the attacker's name. So a request
is answered only when its Host is an IP address (no DNS, so nothing to rebind), `localhost` or a name
under `.localhost` (resolved to loopback by the browser itself, RFC 6761), or a name given with
`--allowed-host` (`*` allows any, for a server behind a proxy that checks names itself). Anything else
is a 403 naming the option, before any handler runs. Compose's services reach looptrace by its
service name, which compose.yaml lists.
"""

from __future__ import annotations

import ipaddress

from aiohttp import web

from .errors import APIError

HOST_NOT_ALLOWED = "host_not_allowed"


def _name(host: str) -> str:
    """The name of a Host header, without its port: `[::1]:8000` → `::1`, `Example.com.:80` → `example.com`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_check(allowed: list[str]):
    """A middleware answering only the Host names above and `allowed` (exact names, or `*`)."""
    names = {_name(a) for a in allowed}
    anything = "*" in names

    def allows(host: str | None) -> bool:
        if anything:
            return True
        if not host:  # HTTP/1.0 without Host: no name was used to reach this server, so none was rebound
            return True
        name = _name(host)
        return name in names or name == "localhost" or name.endswith(".localhost") or _is_address(name)

    @web.middleware
    async def check_host(request: web.Request, handler):
        if not allows(request.headers.get("Host")):
            # The name itself is not repeated: it is the client's text, and the operator's log has the request.
            raise APIError(403, "This server does not answer the Host name this request was sent to (a guard against "
                           "DNS rebinding). If this is a name it is meant to be reached by, start it with "
                           "--allowed-host NAME.", code=HOST_NOT_ALLOWED)
        return await handler(request)

    return check_host
