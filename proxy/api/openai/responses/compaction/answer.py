"""The answer to a compaction: one `compaction` output item, whose `encrypted_content` references the
summary the model wrote (summaries.py).

codex's remote compaction needs exactly one output item, of this type, added and done, then
`response.completed`: so the model's words go nowhere else. Its text is the summary (its reasoning
when it wrote no text); a tool call it makes instead is not run. The item is made at the end, once
the summary is whole: the stream says nothing before it but keepalives. Its reference is signed at
once and the summary kept before the last frame goes out (the relay's `before_end`), so the
client's next request finds it on any process.
"""

from __future__ import annotations

from looptrace.families.base import new_id
from looptrace.families.deltas import TextDelta, ThinkingDelta, ToolCallDelta, UnparsedCallDelta

from .....engine.generation import Generation
from ....errors import APIError
from ....streaming import Event
from ....auth import within
from ..stream import ResponseBuilder
from .summaries import Summaries
from .summaries import new_id as summary_id


def compaction_item(reference: str) -> dict:
    return {"id": new_id("cmp_"), "type": "compaction", "encrypted_content": reference}


class CompactionBuilder(ResponseBuilder):
    """A ResponseBuilder (a StreamFormat) whose answer is one compaction item."""

    def __init__(self, *args, summaries: Summaries, conversation: str | None = None, tenant: str | None = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.summaries = summaries
        self.conversation = conversation
        self.tenant = tenant  # whose summary: kept where only its tenant's references find it
        self.summary_id = summary_id()
        self.summary = ""
        self.reference: str | None = None  # once finished
        self._said: list[str] = []
        self._thought: list[str] = []

    # Every delta is kept for the summary; none is an event of its own.

    def text(self, delta: TextDelta) -> list[Event]:
        self._said.append(delta["text"])
        return []

    def thinking(self, delta: ThinkingDelta) -> list[Event]:
        self._thought.append(delta["text"])
        return []

    def tool_call(self, delta: ToolCallDelta) -> list[Event]:
        return []  # asked for a summary, not an action: never run

    def unparsed_call(self, delta: UnparsedCallDelta) -> list[Event]:
        return []

    def finish(self, generation: Generation) -> list[Event]:
        summary = "".join(self._said).strip() or "".join(self._thought).strip()
        if not summary:
            return self.failed(APIError(500, "The model wrote no summary: the compaction has nothing to keep.",
                                        type="server_error", code="empty_summary"), generation)
        self.summary = summary
        self.reference = self.summaries.sign(self.summary_id, summary)
        item = compaction_item(self.reference)
        self.output.append(item)
        # The response's end as any response's (its status, usage, what the base adds), after the item.
        return (self._event("response.output_item.added", {"output_index": 0, "item": item})
                + self._event("response.output_item.done", {"output_index": 0, "item": item})
                + super().finish(generation))

    async def keep(self, trace_id: str | None) -> None:
        """The summary, kept where every process finds it: before the client hears the end."""
        if self.reference is not None:
            await self.summaries.keep(within(self.tenant, self.summary_id), self.summary,
                                      conversation=self.conversation, trace_id=trace_id)


class AfterCompaction(ResponseBuilder):
    """The answer of a request the server compacted first (context_management): the compaction item,
    then the model's answer on the compacted conversation."""

    def __init__(self, *args, compaction: dict, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.output.append(compaction)  # the model's items follow it

    def start(self, generation: Generation | None = None) -> list[Event]:
        item = self.output.pop(0)  # the response as created holds no item yet
        created = super().start(generation)
        self.output.insert(0, item)
        return (created + self._event("response.output_item.added", {"output_index": 0, "item": item})
                + self._event("response.output_item.done", {"output_index": 0, "item": item}))
