"""A prompt encoded from where it departs from its conversation's previous prompt.

An agent sends its whole conversation again every turn, and tokenizing it again cost two thirds of
the server's time at 100 K tokens. Two facts make the new part enough:

- a fast tokenizer splits its input at added tokens before anything else (leftmost, longest), so
  where an added token starts, the ids before it are those of the text before it;
- transformers encodes a chat whose client strings carry its markers (`sanitize_control_tokens`) one
  piece at a time, and a piece that holds an added token splits there the same way.

So `encode(a + b) == encode(a) + encode(b)` wherever `b` starts with an added token the template
wrote (a cut), and likewise for decoding the ids back to text. An `Encoding` keeps a prompt's marked
text, ids, decoded text and its cuts; the next prompt's text is compared with it, and only the text
from the last cut before the point where they part is encoded (and decoded) again. The ids are
exactly a full encoding's. Every `check_every`-th reuse is checked against a full encoding anyway,
and a difference is counted, logged and answered with the full encoding.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
from array import array
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from looptrace.common.sequences import common_prefix

log = logging.getLogger("looptrace")

# A prompt's opening (an agent's system prompt and tools): the key of a request without a conversation, and
# where a conversation new here looks for another to start from. An opening shorter than this is cheap.
HEAD_CHARS = 2048
CUT_BYTES = 24  # what an Encoding keeps per cut: three array entries and the bisect's share


@dataclass(slots=True)
class Encoding:
    """One prompt as encoded, kept so that the next one can start from it."""

    marked: str  # the template's output; the client's control tokens between transformers' markers
    ids: array  # 'i'
    text: str  # the prompt as the model reads it (the ids decoded)
    cuts: array  # 'q': where in `marked` an added token the template wrote starts
    cut_ids: array  # 'q': how many ids come before each
    cut_text: array | None  # 'q': how many characters of `text`; None when decoding did not split there
    # Random, not a counter: a trace names the encoding a prompt was taken from, and several processes
    # may serve one conversation.
    serial: int = 0

    def __post_init__(self) -> None:
        self.serial = secrets.randbits(62) + 1

    @property
    def size(self) -> int:
        """Bytes held, about: each str as stored (1, 2 or 4 bytes a character), ids, cuts."""
        width = 4 if not self.text.isascii() else 1
        return (len(self.marked) + len(self.text)) * width + 4 * len(self.ids) + CUT_BYTES * len(self.cuts)


@dataclass(slots=True, frozen=True)
class Reuse:
    """What an encoding took from the kept one (`base`, its serial; 0: none): `ids` and `chars` of text
    reused; `checked`: None, or whether a full encoding done to check it agreed."""

    base: int = 0
    ids: int = 0
    chars: int = 0
    checked: bool | None = None


class IncrementalEncoder:
    """Encodes a marked chat with the tokenizer's own `encode_marked_chat`, from the last cut it
    shares with a kept Encoding. Thread-safe: rendering runs on worker threads."""

    def __init__(self, tokenizer: Any, max_bytes: int, check_every: int = 0) -> None:
        from transformers.utils.chat_template_utils import _CONTROL_TOKEN_END, _CONTROL_TOKEN_START

        self.tokenizer = tokenizer
        self.check_every = check_every
        self.kept = KeptEncodings(max_bytes)
        self.checks = self.differences = 0
        added = getattr(tokenizer, "added_tokens_encoder", None) or {}
        self._added = dict(added)
        self._added_ids = np.fromiter(self._added.values(), dtype=np.int64, count=len(self._added))
        # A token that takes the whitespace around it, matches only whole words or is matched on
        # normalized text cannot be cut at where it starts in the raw text.
        flags = {t.content: t for t in tokenizer.added_tokens_decoder.values()} if added else {}
        self._uncuttable = {t for t, f in flags.items() if f.lstrip or f.single_word or f.normalized}
        self._longest = max(map(len, self._added), default=0)
        alternation = "|".join(map(re.escape, sorted(self._added, key=len, reverse=True))) or "(?!)"
        start, end = _CONTROL_TOKEN_START, _CONTROL_TOKEN_END
        # What transformers' encoder reads as one marked piece (a client's token, or a lone marker), or an
        # added token the template wrote: scanned in one pass, in the order the encoder meets them.
        self._scan = re.compile(f"{start}(?:{alternation}){end}|[{start}{end}]|(?P<added>{alternation})")
        self._lock = threading.Lock()
        self._reuses = 0

    @property
    def enabled(self) -> bool:
        return self.kept.max_bytes > 0 and bool(self._added)

    def encode(self, marked: str, key: str | None, salt: str | None = None) -> tuple[Encoding, Reuse]:
        """The ids of `marked` (and its text), from `key`'s kept encoding where they share a cut. `salt`:
        the tenant's (KeptEncodings)."""
        head = marked[:HEAD_CHARS]
        found = self.kept.get(key, head, salt)
        cut = self._shared_cut(found, marked) if found is not None else None
        if cut is None:
            encoding = self._whole(marked)
            reuse = Reuse()
        else:
            encoding, reuse = self._from(found, cut, marked)
            if self.check_every and self._due():
                encoding, reuse = self._checked(encoding, reuse, key)
        self.kept.put(key, head, encoding, salt)
        return encoding, reuse

    # -- the two ways --

    def _whole(self, marked: str) -> Encoding:
        ids = self._encode(marked)
        text = self._decode(ids)
        cuts, cut_ids = self._cuts(marked, ids, 0, 0)
        cut_text = self._cut_text(ids, cut_ids, text)
        return Encoding(marked, array("i", ids), text, cuts, cut_ids, cut_text)

    def _from(self, kept: Encoding, k: int, marked: str) -> tuple[Encoding, Reuse]:
        at, ids_at = kept.cuts[k], kept.cut_ids[k]
        tail = self._encode(marked[at:])
        cuts, cut_ids = self._cuts(marked[at:], tail, at, ids_at)
        ids = kept.ids[:ids_at]
        ids.extend(tail)
        if kept.cut_text is None:  # the kept text could not be split: decoded whole
            text = self._decode(ids.tolist())
            cut_text = None
            chars = 0
        else:
            chars = kept.cut_text[k]
            tail_text, tail_cuts = self._decoded_from(tail, cut_ids, ids_at)
            text = kept.text[:chars] + tail_text
            cut_text = kept.cut_text[:k] + array("q", [chars + c for c in tail_cuts])
        cuts = kept.cuts[:k] + cuts
        cut_ids = kept.cut_ids[:k] + cut_ids
        return Encoding(marked, ids, text, cuts, cut_ids, cut_text), Reuse(kept.serial, ids_at, chars)

    def _checked(self, encoding: Encoding, reuse: Reuse, key: str | None) -> tuple[Encoding, Reuse]:
        whole = self._whole(encoding.marked)
        same = whole.ids == encoding.ids and whole.text == encoding.text
        with self._lock:
            self.checks += 1
            self.differences += not same
        if same:
            return encoding, Reuse(reuse.base, reuse.ids, reuse.chars, True)
        at = common_prefix(whole.ids, encoding.ids)
        log.warning("incremental encoding of conversation %r differed from a full encoding at token %d of %d "
                    "(reused %d): the full encoding is used", key, at, len(whole.ids), reuse.ids)
        return whole, Reuse(checked=False)

    # -- what token continuity (continuity.py) asks of a marked chat --

    def template_tokens(self, marked: str) -> list[tuple[int, str]]:
        """Where each added token the template wrote starts in `marked`, and which (a client's, marked,
        are not among them)."""
        return [(m.start(), m.group("added")) for m in self._scan.finditer(marked) if m.group("added")]

    def encode_marked(self, marked: str) -> list[int]:
        """`marked` encoded whole, as transformers encodes a sanitized chat."""
        return self._encode(marked)

    def keep(self, key: str | None, head: str, ids: list[int], text: str, base: Encoding | None = None,
             salt: str | None = None) -> int:
        """Keeps a prompt built of ids rather than encoded from text (token continuity's): the next turn
        reads its ids and text, and a prompt encoded from text reuses nothing of it (it has no cuts).
        `base`: the kept encoding whose ids `ids` start with, copied as an array rather than converted
        again (a turn costs what it adds). Its serial."""
        kept = base.ids + array("i", ids[len(base.ids):]) if base is not None else array("i", ids)
        encoding = Encoding("", kept, text, array("q"), array("q"), None)
        self.kept.put(key, head, encoding, salt)
        return encoding.serial

    def decode_pieces(self, pieces: list[list[int]]) -> list[str]:
        """Each list of ids decoded on its own, in one call into the tokenizer."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return backend.decode_batch(pieces, skip_special_tokens=False)
        return [self._decode(p) for p in pieces]

    # -- helpers --

    def _shared_cut(self, kept: Encoding, marked: str) -> int | None:
        """The last cut of `kept` that `marked` shares, whole token included, or None."""
        if not kept.cuts:
            return None
        shared = common_prefix(kept.marked, marked)
        # The token at the cut, and any token that might start before it and reach past it, lie in
        # the shared text: then `marked` splits there as `kept` did.
        k = bisect_right(kept.cuts, shared - self._longest) - 1
        return k if k >= 0 else None

    def _due(self) -> bool:
        with self._lock:
            self._reuses += 1
            return self._reuses % self.check_every == 0

    def _encode(self, marked: str) -> list[int]:
        from transformers.utils.chat_template_utils import encode_marked_chat

        return encode_marked_chat(self.tokenizer, marked)

    def _decode(self, ids: list[int]) -> str:
        # The fast tokenizer's own decode where there is one: transformers' checks every id in Python
        # first (half a millisecond for a 5,000-token prompt) and then calls it the same way.
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return backend.decode(ids if isinstance(ids, list) else list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _cuts(self, marked: str, ids: list[int], offset: int, ids_offset: int) -> tuple[array, array]:
        """Each added token the template wrote in `marked` (outside the client's marked pieces), matched
        with its id in `ids`, in order: where an encoding may be cut. Empty when the two disagree (a
        token matched on normalized text, say): then nothing is reused from this encoding."""
        found = [(m.start(), m.group("added")) for m in self._scan.finditer(marked) if m.group("added")]
        at = np.flatnonzero(np.isin(np.asarray(ids, dtype=np.int64), self._added_ids))
        if len(at) != len(found) or any(ids[i] != self._added[t] for i, (_, t) in zip(at.tolist(), found)):
            return array("q"), array("q")
        cuts = array("q")
        cut_ids = array("q")
        for i, (pos, token) in zip(at.tolist(), found):
            if token not in self._uncuttable:
                cuts.append(offset + pos)
                cut_ids.append(ids_offset + i)
        return cuts, cut_ids

    def _decoded_from(self, ids: list[int], cut_ids: array, ids_offset: int) -> tuple[str, list[int]]:
        """`ids` decoded, and where each cut among them (`cut_ids`, counted from `ids_offset`) falls in the text."""
        return self._decode_at(ids, [c - ids_offset for c in cut_ids])

    def _cut_text(self, ids: list[int], cut_ids: array, text: str) -> array | None:
        """Where each cut falls in `text`; None when decoding the pieces does not give `text` back."""
        joined, offsets = self._decode_at(ids, list(cut_ids))
        return array("q", offsets) if joined == text else None

    def _decode_at(self, ids: list[int], bounds: list[int]) -> tuple[str, list[int]]:
        """`ids` decoded in pieces cut at `bounds` (ascending), in one call into the tokenizer: the text,
        and where each bound falls in it."""
        edges = [0, *(b for b in bounds if 0 < b < len(ids)), len(ids)]
        pieces = [ids[a:b] for a, b in zip(edges, edges[1:])]
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        texts = backend.decode_batch(pieces, skip_special_tokens=False) if backend is not None \
            else [self._decode(p) for p in pieces]
        starts, length = {}, 0
        for edge, text in zip(edges, texts):
            starts[edge] = length
            length += len(text)
        return "".join(texts), [starts[b] for b in bounds]


class KeptEncodings:
    """The newest encodings, by conversation (or, without one, by the prompt's opening), within a
    bound on their bytes; the least recently used go first.

    A prompt's opening is found only under the salt it was kept with (the tenant's: DecodeRequest.cache_salt),
    so no tenant's prompt is encoded from, or timed against, another's. A conversation's key is its own
    tenant's already (proxy/api/auth.py's `within`)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._by_key: OrderedDict[str, Encoding] = OrderedDict()
        self._by_head: dict[tuple[str | None, str], str] = {}  # (salt, a prompt's opening) → its last key
        self._salt_of: dict[str, str | None] = {}  # each key's salt, for the opening it leaves when it goes
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str | None, head: str, salt: str | None = None) -> Encoding | None:
        with self._lock:
            found = self._by_key.get(key) if key is not None else None
            if found is None:  # a conversation new here may still share its opening with another of its tenant
                found = self._by_key.get(self._by_head.get((salt, head), ""))
            return found

    def put(self, key: str | None, head: str, encoding: Encoding, salt: str | None = None) -> None:
        # Without a conversation, one slot per opening and salt (a tenant's conversations are "tenant/…").
        key = key if key is not None else ("\0head:" if salt is None else f"\0head:{salt}:") + head
        size = encoding.size
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._by_key.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            self._by_key[key] = encoding
            self._by_head[(salt, head)] = key
            self._salt_of[key] = salt
            self._bytes += size
            while self._bytes > self.max_bytes:
                gone_key, gone = self._by_key.popitem(last=False)
                self._bytes -= gone.size
                gone_head = (self._salt_of.pop(gone_key, None), gone.marked[:HEAD_CHARS])
                if self._by_head.get(gone_head) == gone_key:
                    del self._by_head[gone_head]

    def __len__(self) -> int:
        return len(self._by_key)
