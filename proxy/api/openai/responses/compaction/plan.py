"""Compaction on the Responses API: what a request asks (a `compaction_trigger` item, `context_management`'s
threshold) and how the `compaction` items it carries are read.

- A `compaction_trigger` item (codex's remote compaction; the last input item) asks the model for a
  summary: it is rendered as a user message holding the compaction prompt (COMPACTION_PROMPT, or the
  file `--compaction-prompt` names), with the family's template like any message, and the answer is
  one `compaction` item (answer.py).
- A `compaction` item coming back is rendered where it stands as a user message: SUMMARY_HEADER, then
  the summary its reference names (summaries.py). It replaces the model's turns before it (assistant
  messages, reasoning, tool calls and their results); system, developer and user messages before it
  stay, which is the window a compaction leaves (what /v1/responses/compact answers, what codex keeps).
  A reference that cannot be expanded is a 400 naming the item: nothing is rendered without it.
- `context_management: [{"type": "compaction", "compact_threshold": N}]`: when the rendered prompt
  passes N tokens, the server compacts first (run.py).
- A client that compacts on its own side (codex with a custom provider) sends an ordinary request; one
  whose metadata says it is a compaction is only marked as one in its trace (how: `client`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from ....auth import tenant_of
from ....errors import APIError, invalid
from ....keys import SETTINGS, TELEMETRY
from ....request_parts import warn_once
from ..protocol import Compaction, CompactionTrigger, ResponsesRequest, TurnMetadata
from ..request import Previous
from .summaries import SUMMARIES, SharedSummaries, Summaries, Unresolved

TRIGGER = "compaction_trigger"
ITEMS = ("compaction", "compaction_summary")  # OpenAI's name, and the one some clients use
METADATA_CHARS = 65536  # codex's turn metadata is about 1 KB: longer is not read
THRESHOLD_SHARE = 0.8  # a compaction entry without compact_threshold: this share of the model's context

# What the model is asked when a compaction is triggered (docs/clients.md, "Compaction").
COMPACTION_PROMPT = """\
Write a summary of the conversation so far, for you to continue the work from once everything before \
this message is gone. Only the system prompt, the user's messages and this summary will remain.

Include:
- the task, and what has been done so far, with the decisions made and why;
- what was learnt that matters: file names, commands and their results, errors and their fixes;
- what remains to be done, as next steps.

Write only the summary, in plain text."""
# What a `compaction` item's summary is preceded by when rendered.
SUMMARY_HEADER = "A summary of the conversation before this point, which it replaces:\n\n"


def compaction_prompt(path: str | None) -> str:
    """The compaction prompt: the default, or the text of the operator's file (read once, at start)."""
    if path is None:
        return COMPACTION_PROMPT
    text = Path(path).expanduser().read_text(encoding="utf-8").strip()
    if not text:
        raise ValueError(f"{path} is empty")
    return text


_PROMPT: web.AppKey[str] = web.AppKey("compaction_prompt", str)


def setup(app: web.Application) -> None:
    """The app's summaries (in the trace store's state where there is one) and compaction prompt."""
    state = app[TELEMETRY].state
    app[SUMMARIES] = SharedSummaries(state) if state is not None else Summaries()
    app[_PROMPT] = compaction_prompt(app[SETTINGS].compaction_prompt)

    async def close(app: web.Application) -> None:
        app[SUMMARIES].close()

    app.on_cleanup.append(close)


@dataclass
class Plan:
    """What a Responses request asks of compaction, its compaction items expanded; handed to the
    conversion (request.py), whose to_messages asks it what each such item says."""

    prompt: str
    trigger: CompactionTrigger | None = None  # this request's compaction_trigger item (the last of its input)
    threshold: int | None = None  # compact first past this many prompt tokens (context_management)
    thresholded: bool = False  # context_management asked for compaction (threshold None: THRESHOLD_SHARE)
    summaries: dict[str, str] = field(default_factory=dict)  # each compaction item's reference → its summary
    replaced: int = 0  # for a trigger: the items before it, which its summary replaces
    client: bool = False  # the client compacts on its own side and says this request is it (codex's metadata)

    def render(self, item: Compaction | CompactionTrigger, out) -> None:
        """A compaction item or trigger, said in `out` (request.py's messages being gathered)."""
        if isinstance(item, CompactionTrigger):
            # This request's own asks for the summary; one in a stored conversation was a request once.
            if item is self.trigger:
                out.said("user", self.prompt)
            return
        # The summary replaces the model's turns before it: its messages, calls and their results.
        out.out = [m for m in out.out if m["role"] in ("system", "user")]
        out.said("user", SUMMARY_HEADER + self.summaries[item.encrypted_content])

    def limit(self, max_model_len: int) -> int | None:
        """The prompt tokens past which the server compacts first, or None."""
        if not self.thresholded:
            return None
        return self.threshold if self.threshold is not None else int(max_model_len * THRESHOLD_SHARE)


async def plan(http: web.Request, body: ResponsesRequest, previous: Previous | None) -> Plan:
    """What `body` (continuing `previous`, a stored conversation) asks of compaction, its compaction items
    expanded: a 400 naming the first that cannot be, before anything is rendered or kept."""
    found = Plan(http.app[_PROMPT])
    _context_management(body, found)
    earlier = previous.items if previous is not None else []
    items = [*earlier, *body.items]
    offset = len(earlier)
    summaries = http.app[SUMMARIES]
    for index, item in enumerate(items):
        where = f"input[{index - offset}]" if index >= offset else "previous_response_id"
        if isinstance(item, CompactionTrigger) and index >= offset:
            if index != len(items) - 1:
                raise invalid(f"'{where}' is a compaction_trigger: it must be the last input item.", param=where)
            found.trigger, found.replaced = item, len(items) - 1
        elif isinstance(item, Compaction):
            await _expand(http, summaries, item, where, found)
    if found.trigger is None and _client_compaction(body):
        found.client, found.replaced = True, len(items) - 1  # all but its last message, which asks for the summary
    if found.trigger is not None or found.thresholded:
        await _key(summaries)  # a compaction is signed at its end: the key is read now, while it can refuse
    return found


async def _expand(http: web.Request, summaries: Summaries, item: Compaction, where: str, found: Plan) -> None:
    reference = item.encrypted_content
    if reference in found.summaries:
        return
    await _key(summaries)
    summary = await summaries.expand(reference, tenant_of(http))
    metrics = http.app[TELEMETRY].metrics
    if isinstance(summary, Unresolved):
        metrics.compaction_item(summary.kind)
        raise APIError(400, f"The compaction item '{where}' cannot be expanded: {summary.reason}. Send the "
                       "conversation without it (or with the items it replaced).",
                       param=f"{where}.encrypted_content", code="invalid_encrypted_content")
    metrics.compaction_item("expanded")
    found.summaries[reference] = summary


async def _key(summaries: Summaries) -> bytes:
    try:
        return await summaries.key()
    except Exception as exc:  # noqa: BLE001 - said to the client: compaction needs the store's key
        where = summaries.state.where if isinstance(summaries, SharedSummaries) else "?"
        raise APIError(503, f"Compaction needs the key kept in the store at {where}, which does not answer: "
                       f"{str(exc).strip() or 'no reason given'}", type="server_error",
                       code="compaction_store_unavailable") from exc


def _context_management(body: ResponsesRequest, found: Plan) -> None:
    for entry in body.context_management or ():
        if entry.type != "compaction":
            warn_once(f"context_management:{entry.type}", "ignoring context_management entries of type %r", entry.type)
            continue
        found.thresholded, found.threshold = True, entry.compact_threshold


def _client_compaction(body: ResponsesRequest) -> bool:
    """Whether the client says this request is a compaction of its own: codex's turn metadata does
    (`request_kind` "compaction": a custom provider's local compaction). Read only to mark the step."""
    turn = body.client_metadata.codex_turn if body.client_metadata else None
    if not isinstance(turn, str) or '"compaction"' not in turn or len(turn) > METADATA_CHARS:
        return False  # the common case: nothing parsed
    try:
        said = TurnMetadata.model_validate_json(turn)
    except ValueError:  # a client's string (pydantic's ValidationError): whatever it holds, it only fails to say so
        return False
    return said.request_kind == "compaction"
