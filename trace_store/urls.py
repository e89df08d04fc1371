"""A store's URL as it may be shown (logs, errors, /health): never its password."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redacted(url: str) -> str:
    """A URL as it may be shown: no password, no query (libpq takes one there too)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = (f"{parts.username}@" if parts.username else "") + (f"[{host}]" if ":" in host else host)
        if parts.port:
            netloc += f":{parts.port}"
    except ValueError:
        return url.split("://", 1)[0] + "://…"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
