"""A scripted Qwen3.5 for long agent sessions that compact: what it writes depends on what its prompt
asks, so a real client's session runs the same whenever the client decides to compact.

Asked for a summary (the prompt's last message is looptrace's compaction prompt, or codex's own
"CONTEXT CHECKPOINT COMPACTION" request), it writes `SUMMARY-<n>: …`; otherwise it calls the shell
tool with the next of its commands, and once all have run it answers. It is the replay backend
underneath (one recorded step made per request), so the tokens go through the same tokenizer,
parser, API and tracing as a model's.
"""

from __future__ import annotations

from looptrace.backends.recorded import ReplayBackend
from looptrace.proxy.api.openai.responses.compaction.plan import COMPACTION_PROMPT

from messages_api import qwen_call

# What the compaction prompts open with: looptrace's (a remote compaction's) and codex's own (a local one).
ASKS_FOR_SUMMARY = (COMPACTION_PROMPT.split(",")[0], "CONTEXT CHECKPOINT COMPACTION")
TAIL_TOKENS = 1500  # the end of the prompt read for that request: its last message and the generation prompt


class CompactingAgent:
    """A backend (the protocol of backends/base.py) writing Qwen3.5's format."""

    def __init__(self, vocab, commands: list[str], answer: str, tool: str = "exec_command",
                 argument: str = "cmd") -> None:
        self.vocab, self.commands, self.answer = vocab, commands, answer
        self.tool, self.argument = tool, argument
        self.ran = 0  # commands called so far
        self.summaries: list[str] = []  # the summaries written, in order
        self.name, self.route, self.running, self.waiting = "replay", None, 0, 0
        self.serving, self.upstreams, self.expands_media, self.media_refusal = True, (), False, ""

    def health_details(self) -> dict:
        return {}

    def _asks_for_summary(self, prompt_ids: list[int]) -> bool:
        tail = self.vocab.tokenizer.decode(prompt_ids[-TAIL_TOKENS:])
        last_user = tail.rsplit("<|im_start|>user\n", 1)[-1]
        return any(marker in last_user for marker in ASKS_FOR_SUMMARY)

    def _next(self, prompt_ids: list[int]) -> str:
        if self._asks_for_summary(prompt_ids):
            summary = f"SUMMARY-{len(self.summaries) + 1}: commands 1 to {self.ran} ran; {len(self.commands) - self.ran} left."
            self.summaries.append(summary)
            return "Summing up.\n</think>\n\n" + summary + "<|im_end|>"
        if self.ran < len(self.commands):
            self.ran += 1
            return ("Next command.\n</think>\n\n" + qwen_call(self.tool, **{self.argument: self.commands[self.ran - 1]})
                    + "<|im_end|>")
        return "All done.\n</think>\n\n" + self.answer + "<|im_end|>"

    async def generate(self, request):
        step = ReplayBackend([{"text": self._next(request.prompt_ids)}], self.vocab)
        async for event in step.generate(request):
            yield event

    async def close(self) -> None:
        return None
