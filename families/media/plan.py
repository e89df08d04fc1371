"""A request's attached items, found once: the plan every step reads instead of walking the
conversation again (fetching URLs, choosing where to render, checking limits, decoding, rendering,
the prefix cache's key, the trace).

The API adapters put each item into the conversation as a part `{"type": KIND, "media": MediaPart}`;
`MediaPlan.of` walks the messages once, in order, noting which role each item came from. Decoding
happens on the rendering thread (`decoded`), never on the event loop; so does reading a PDF's text
(pdf.py), which becomes text before anything else reads the conversation, whatever the model takes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .decode import decode_audio, decode_image, decode_video, image_size, thumbnail
from .parts import MediaError, MediaLimits, MediaPart, noted_in_tool_results, with_decoded
from .pdf import with_pdf_text


@dataclass(slots=True)
class MediaPlan:
    parts: list[MediaPart]  # every attached item, in the conversation's order
    roles: list[str]  # the role of the message each came in
    # PDFs, read as text on the rendering thread (pdf.with_pdf_text): never items the model reads as such.
    pdfs: list[MediaPart] = field(default_factory=list)

    @classmethod
    def of(cls, messages: list[dict]) -> MediaPlan:
        parts, roles, pdfs = [], [], []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, list):
                continue
            for part in content:
                if not isinstance(part, dict) or not isinstance(part.get("media"), MediaPart):
                    continue
                if part["media"].kind == "pdf":
                    pdfs.append(part["media"])
                else:
                    parts.append(part["media"])
                    roles.append(message.get("role", ""))
        return cls(parts, roles, pdfs)

    def __bool__(self) -> bool:
        return bool(self.parts)

    def __len__(self) -> int:
        return len(self.parts)

    def with_pdf_text(self, messages: list[dict]) -> list[dict]:
        """The conversation with each PDF read as its pages' text (pdf.py); a MediaError names one that
        cannot be read."""
        return with_pdf_text(messages) if self.pdfs else messages

    def to_fetch(self) -> list[MediaPart]:
        """The items given by URL, not fetched yet."""
        return [p for p in self.parts if p.url and p.raw is None]

    def readable(self, messages: list[dict], accepted: frozenset[str], model: str) -> tuple[list[dict], MediaPlan]:
        """The conversation and plan with what the model cannot read dealt with: an item of another
        kind in a tool's output becomes a note (the client did not choose to send it here); one a
        user attached is refused, naming it."""
        if all(p.kind in accepted for p in self.parts):
            return messages, self
        for part, role in zip(self.parts, self.roles):
            if part.kind not in accepted and role != "tool":
                takes = ", ".join(sorted(accepted)) + " and text" if accepted else "text only"
                raise MediaError(f"This model ({model}) takes {takes}: the {part.kind} at {part.param} cannot be read.",
                                 part.param, code="media_unsupported")
        kept = [(p, r) for p, r in zip(self.parts, self.roles) if p.kind in accepted]
        return noted_in_tool_results(messages, accepted), MediaPlan([p for p, _ in kept], [r for _, r in kept])

    def check(self, limits: MediaLimits, refusal: str) -> None:
        """Limits on the request as a whole, and the backend's own refusal ("" when it takes media)."""
        if len(self.parts) > limits.max_items:
            raise MediaError(f"This request attaches {len(self.parts)} items; the limit is {limits.max_items} "
                             "(--media-max-items).", self.parts[limits.max_items].param, code="media_too_large")
        if refusal:
            raise MediaError(refusal, self.parts[0].param, code="media_unsupported")

    def image_tokens(self, limits: MediaLimits, processor: Any) -> int:
        """Before any pixel is decoded: each image's size read from its header and held to the limits,
        per image and for the request's images in all, and the placeholder tokens the processor will
        make of them, by its own count from the sizes alone (0 where it has none)."""
        sizes, pixels = [], 0
        for part in self.parts:
            if part.kind != "image":
                continue
            width, height = image_size(part, limits)
            pixels += width * height
            if pixels > limits.max_request_pixels:
                raise MediaError(f"The request's images are {pixels:,} pixels or more in all, with the one at "
                                 f"{part.param}; the limit is {limits.max_request_pixels:,} "
                                 "(--media-max-request-pixels).", part.param, code="media_too_large")
            sizes.append([height, width])
        count = getattr(processor, "_get_num_multimodal_tokens", None)  # the count vLLM asks processors for
        if not sizes or count is None:
            return 0
        try:
            return sum(count(image_sizes=sizes).num_image_tokens)
        except (AttributeError, NotImplementedError, TypeError, ValueError):
            return 0  # a processor that cannot say: the count after rendering decides alone

    def decoded(self, messages: list[dict], limits: MediaLimits, audio_rate: int,
                sample_video: Callable[..., Any] | None) -> list[dict]:
        """The conversation with each item decoded as the processor reads it (its `info` filled, and a
        thumbnail for the trace); a MediaError names the part that failed."""
        decoded = {}
        for part in self.parts:
            if part.kind == "audio":
                decoded[id(part)] = decode_audio(part, limits, audio_rate)
            elif part.kind == "video":
                video = decoded[id(part)] = decode_video(part, limits, sample_video)
                part.info["thumbnail"] = thumbnail(video[0][0])  # its first frame
            else:
                image = decoded[id(part)] = decode_image(part, limits)
                part.info["thumbnail"] = thumbnail(image)  # a few kB, for the trace (when it keeps content)
        return with_decoded(messages, decoded)

    def cache_key(self, runs: list[tuple[int, int, int]]) -> tuple:
        """(offset, span, sha256) of each item's tokens: what a prefix cache keys a kept prompt on."""
        return tuple((offset, span, part.info.get("sha256", "")) for (offset, span, _), part in zip(runs, self.parts))

    def data_urls(self) -> list[tuple[str, str]]:
        """(kind, data URL) of each item, for a server that expands them itself (vLLM)."""
        return [(p.kind, p.data_url()) for p in self.parts]
