"""Who is calling: an agent session's conversation id and the client's name and version, from what
the request carries. Only ever recorded, never trusted: they become span attributes, not labels."""

from __future__ import annotations

from collections.abc import Mapping

from looptrace.common import attributes as attr

from .agents import genai_agent, side_request_of
from .errors import invalid

# The headers that name a session, the first a request sends (a printable label of at most
# MAX_ROLLOUT_CHARS) winning; then the body's prompt_cache_key (Responses clients: Copilot CLI);
# then its history (history_sessions.py). Headers are read case-insensitively.
SESSION_HEADERS = (
    ("x-session-affinity", "pi, opencode, Crush (beside x-session-id)"),
    ("x-session-id", "X-Session-Id: Crush and other harnesses"),
    ("x-opencode-session", "opencode"),
    ("agent-session-id", "goose"),
    ("session_id", "pi"),
    ("session-id", "codex: its root thread's, a subagent's too"),
    ("thread-id", "codex: its own thread"),
    ("x-claude-code-session-id", "Claude Code, on every request"),
)
CONVERSATION_HEADERS = tuple(name for name, _ in SESSION_HEADERS)
PROMPT_CACHE_KEY = "prompt_cache_key"


# A rollout (agent RL) names itself in the path, for harnesses that cannot add a header (a base URL
# of /r/{id}/v1, or /r/{id} for Anthropic's clients), or in X-Rollout-Id; its group in X-Rollout-Group.
ROLLOUT_PREFIX = "/r/{rollout}"
MAX_ROLLOUT_CHARS = 256


def rollout_of(path_values: Mapping[str, str], headers: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(rollout id, group), each None where not given; a 400 for one too long or holding control
    characters (they become keys, span attributes and the viewer's text, never markup)."""
    said = sent(headers)
    found = []
    for value, name in ((path_values.get("rollout") or said["x-rollout-id"], "rollout id"),
                        (said["x-rollout-group"], "rollout group")):
        if value is not None and (not value or len(value) > MAX_ROLLOUT_CHARS or not value.isprintable()):
            raise invalid(f"A {name} is 1 to {MAX_ROLLOUT_CHARS} printable characters.", param=name.replace(" ", "_"))
        found.append(value)
    return found[0], found[1]


def weight_version(headers: Mapping[str, str]) -> str | None:
    """X-Weight-Version, the trainer's label for the weights serving the request (exported with each
    step): a 400 for one that is empty, too long or holds control characters, never dropped unsaid."""
    version = sent(headers)["x-weight-version"]
    if version is not None and (not version or len(version) > MAX_ROLLOUT_CHARS or not version.isprintable()):
        raise invalid(f"X-Weight-Version is 1 to {MAX_ROLLOUT_CHARS} printable characters.", param="weight_version")
    return version


def session_of(headers: Mapping[str, str], body: dict | None) -> tuple[str | None, str | None]:
    """(the session a request names, where it named it: a header's name or "prompt_cache_key"), or
    (None, None); a label that is not printable and short is passed over, never recorded."""
    for name in CONVERSATION_HEADERS:
        value = _label(headers.get(name))
        if value is not None:
            return value, name
    key = (body or {}).get(PROMPT_CACHE_KEY)  # what Responses clients send when no header says it
    value = _label(key) if isinstance(key, str) else None
    return (value, PROMPT_CACHE_KEY) if value is not None else (None, None)


def sent(headers: Mapping[str, str]) -> dict[str, str | None]:
    """The headers this module reads, each once: None where a request did not send it."""
    return {name: headers.get(name) for name in READ_HEADERS}


def client_of(user_agent: str | None) -> tuple[str | None, str | None]:
    """'codex_exec/0.169.0 (Linux; x86_64) …' → ('codex_exec', '0.169.0'); the Stainless SDKs' way,
    'Agents/Python 0.24.0' (the OpenAI Agents SDK), → ('Agents', '0.24.0')."""
    if not user_agent:
        return None, None
    words = user_agent.split()
    name, _, version = words[0].partition("/")
    if version.isalpha() and len(words) > 1 and words[1][:1].isdigit():  # NAME/LANGUAGE VERSION
        version = words[1]
    return name or None, version or None


# An SDK's own User-Agent names the library, not the harness calling through it (Copilot CLI sends
# the stock `OpenAI/JS 5.20.1`; Cline `ai-sdk/openai-compatible/3.0.37 …`): such a client is named by
# a header only it sends, or left unknown rather than recorded as "OpenAI" version "JS".
SDK_AGENTS = ("OpenAI/", "Anthropic/", "ai-sdk/")
SIGNATURE_HEADERS = (("x-initiator", "copilot"),)  # GitHub Copilot's: who began the turn (user, agent)


def named_client(user_agent: str, headers: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(name, version) of the client behind `user_agent`, each None where unknown."""
    if not user_agent.startswith(SDK_AGENTS):
        return client_of(user_agent)
    for header, name in SIGNATURE_HEADERS:
        if headers.get(header):
            return name, None  # it says nothing of its version
    return None, None


# A subagent's requests share its parent's conversation id; these say which agent sent one. Claude Code
# sends its subagents' ids (the main agent sends none); a codex child sends its own thread-id beside the
# root's session-id, and its parent's thread (a root's thread-id is its session: no subagent).
SUBAGENT_HEADERS = (("x-claude-code-agent-id", "x-claude-code-parent-agent-id", "x-claude-code-agent-type"),
                    ("x-codex-parent-thread-id", "x-codex-parent-thread-id", "x-openai-subagent"))


# Every header read here, by its name in lower case (a request's headers are case-insensitive).
READ_HEADERS = tuple(dict.fromkeys((*CONVERSATION_HEADERS, "x-rollout-id", "x-rollout-group", "x-weight-version",
                                    "user-agent", *(name for names in SUBAGENT_HEADERS for name in names))))


def subagent_of(headers: Mapping[str, str]) -> dict:
    """The subagent attributes of a request (none for a main agent's): its id, its parent's, its kind."""
    said = sent(headers)
    for marker, parent, kind in SUBAGENT_HEADERS:
        if _label(said[marker]) is None:
            continue
        agent = said["x-claude-code-agent-id"] if marker.startswith("x-claude") else said["thread-id"]
        found = {attr.AGENT_ID: _label(agent), attr.AGENT_PARENT_ID: _label(said[parent]),
                 attr.AGENT_TYPE: _label(said[kind])}
        return {k: v for k, v in found.items() if v is not None} if found[attr.AGENT_ID] else {}
    return {}


def agent_attributes(headers: Mapping[str, str]) -> dict:
    """Which agent sent a request: a subagent's attributes, a side request's (agents.py), {} for the main agent's."""
    found = subagent_of(headers) or side_request_of(headers)
    return {**found, **genai_agent(found)}


def _label(value: str | None) -> str | None:
    """A client's label as recorded: printable and short, else none (it is shown and exported, never trusted)."""
    return value if value and len(value) <= MAX_ROLLOUT_CHARS and value.isprintable() else None


def request_attributes(method: str, path: str, headers: Mapping[str, str]) -> dict:
    """The server span's attributes about the HTTP request and its client."""
    said = sent(headers)
    attributes = {attr.HTTP_REQUEST_METHOD: method, attr.URL_PATH: path, **agent_attributes(headers)}
    version = _label(said["x-weight-version"])
    if version:  # a trainer's label; one that is not is refused (weight_version)
        attributes[attr.WEIGHT_VERSION], attributes[attr.WEIGHT_VERSION_SOURCE] = version, "header"
    agent = said["user-agent"]
    if agent:
        name, version = named_client(agent, headers)
        attributes[attr.USER_AGENT_ORIGINAL] = agent
        if name:
            attributes[attr.CLIENT_NAME] = name
        if version:
            attributes[attr.CLIENT_VERSION] = version
    return attributes
