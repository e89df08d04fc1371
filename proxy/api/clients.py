"""Who is calling: an agent session's conversation id and the client's name and version, from what
the request carries. Only ever recorded, never trusted: they become span attributes, not labels."""

from __future__ import annotations

from collections.abc import Mapping

from looptrace.common import attributes as attr

from .errors import invalid

# Conversation ids, in the order clients are known to send them: codex (session-id, thread-id),
# pi (session_id, x-session-affinity), Claude Code (X-Claude-Code-Session-Id, on every request).
CONVERSATION_HEADERS = ("session-id", "session_id", "thread-id", "x-session-affinity", "x-claude-code-session-id")


# A rollout (agent RL) names itself in the path, for harnesses that cannot add a header (a base URL
# of /r/{id}/v1, or /r/{id} for Anthropic's clients), or in X-Rollout-Id; its group in X-Rollout-Group.
ROLLOUT_PREFIX = "/r/{rollout}"
MAX_ROLLOUT_CHARS = 256


def rollout_of(path_values: Mapping[str, str], headers: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(rollout id, group), each None where not given; a 400 for one too long or holding control
    characters (they become keys, span attributes and the viewer's text, never markup)."""
    found = []
    for value, name in ((path_values.get("rollout") or headers.get("X-Rollout-Id"), "rollout id"),
                        (headers.get("X-Rollout-Group"), "rollout group")):
        if value is not None and (not value or len(value) > MAX_ROLLOUT_CHARS or not value.isprintable()):
            raise invalid(f"A {name} is 1 to {MAX_ROLLOUT_CHARS} printable characters.", param=name.replace(" ", "_"))
        found.append(value)
    return found[0], found[1]


def conversation_id(headers: Mapping[str, str], body: dict | None) -> str | None:
    for name in CONVERSATION_HEADERS:
        value = headers.get(name)
        if value:
            return value
    key = (body or {}).get("prompt_cache_key")  # what Responses clients send when no header says it
    return key if isinstance(key, str) and key else None


def client_of(user_agent: str | None) -> tuple[str | None, str | None]:
    """'codex_exec/0.169.0 (Linux; x86_64) …' → ('codex_exec', '0.169.0')."""
    if not user_agent:
        return None, None
    product = user_agent.split()[0]
    name, _, version = product.partition("/")
    return name or None, version or None


def request_attributes(method: str, path: str, headers: Mapping[str, str]) -> dict:
    """The server span's attributes about the HTTP request and its client."""
    attributes = {attr.HTTP_REQUEST_METHOD: method, attr.URL_PATH: path}
    version = headers.get("X-Weight-Version")
    if version and len(version) <= MAX_ROLLOUT_CHARS and version.isprintable():  # a trainer's label, else none
        attributes[attr.WEIGHT_VERSION], attributes[attr.WEIGHT_VERSION_SOURCE] = version, "header"
    agent = headers.get("User-Agent")
    if agent:
        name, version = client_of(agent)
        attributes[attr.USER_AGENT_ORIGINAL] = agent
        if name:
            attributes[attr.CLIENT_NAME] = name
        if version:
            attributes[attr.CLIENT_VERSION] = version
    return attributes
