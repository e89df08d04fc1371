"""What each vLLM server holds in its prefix cache, block by block, keyed on the tokens.

vLLM caches a prompt in blocks of `block_size` tokens and finds a block by a hash chained over every
block before it. looptrace never computes vLLM's hash (it depends on vLLM's version, its hash
function and a seed): it keys each block on its tokens, chained the same way (a block's key is a hash
of the previous block's key and its own tokens), so a prompt's blocks are looked up by their tokens
alone. A `BlockStored` event carries both its blocks' tokens and vLLM's hashes: each hash is mapped to
its key once, for the `BlockRemoved` events, which carry hashes only.

Two indexes answer the same question (`cached_tokens(prompt)`: how much of this prompt the server
would find cached):

- `EventIndex`: fed by the server's own KV events (kv_events.py): what it holds, as it says.
- `SentIndex`: what looptrace itself sent the server (prompts and the answers to them), the most
  recent kept up to the server's capacity: an estimate, for a server without events, or while its
  events cannot be trusted (a publisher gone silent).

`Holdings` keeps both for one server and says which one a prediction came from, and adds the blocks of the prompts
looptrace sent the server and has not seen the end of: the server computes them ahead of a request queued behind
them, which finds them cached (without them, a conversation's turn routed while another conversation's first turn
was being read was predicted to miss the system prompt both share; that was most of bench/routing.py's prediction
error). `SharedPrefixes` tells
the part of a prompt it shares with other conversations (a system prompt, tool definitions): every server
holds that sooner or later, and routing weighs what a conversation holds beyond it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

ROOT = 0  # the chain's key before a prompt's first block
DEFAULT_BLOCK = 16  # vLLM's block size on GPUs, until the server says (its events, its /metrics)
PRIMARY = (None, "GPU")  # the engine's own cache; an offloading tier's events ("CPU", …) are not it


class PromptBlocks:
    """A prompt's block keys, computed once per block size and only as far as a lookup walks."""

    __slots__ = ("ids", "_keys")

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self._keys: dict[int, list[int]] = {}

    def keys(self, block_size: int, limit: int) -> Iterator[int]:
        """The keys of the first `limit` whole blocks, in order."""
        keys = self._keys.setdefault(block_size, [])
        yield from keys[:limit]
        ids, n = self.ids, len(keys)
        key = keys[-1] if keys else ROOT
        while n < limit:
            key = hash((key, *ids[n * block_size:(n + 1) * block_size]))
            keys.append(key)
            n += 1
            yield key

    def usable_blocks(self, block_size: int) -> int:
        """Whole blocks vLLM may find cached: it computes at least the prompt's last token again."""
        return max(0, len(self.ids) - 1) // block_size


class EventIndex:
    """The blocks a server's KV events say it holds."""

    source = "events"

    def __init__(self) -> None:
        self.block_size: int | None = None
        self.group: int | None = None  # the KV-cache group followed (several only in hybrid models)
        self._key_of: dict[object, int] = {}  # vLLM's block hash → our key
        self._held: dict[int, int] = {}  # our key → how many of vLLM's hashes hold it
        self.skipped = 0  # blocks of events that could not be placed (an unknown parent, media, LoRA)

    def __len__(self) -> int:
        return len(self._key_of)

    def stored(self, event: dict) -> None:
        hashes, tokens = event.get("block_hashes") or [], event.get("token_ids") or []
        size, parent = event.get("block_size"), event.get("parent_block_hash")
        if event.get("medium") not in PRIMARY or event.get("lora_name") or event.get("lora_id") is not None:
            return
        group = event.get("group_idx") or 0
        if self.group is None:
            self.group = group
        if group != self.group:
            return
        if self.block_size is None:
            self.block_size = size
        extra = event.get("extra_keys") or ()
        key = ROOT if parent is None else self._key_of.get(parent)
        # A block of another size (a partial one) or of unknown parent cannot be placed in the chain; nor can
        # one whose hash took more than its tokens (media, a cache salt): what follows them is unknown too.
        if (size != self.block_size or key is None or len(tokens) != len(hashes) * size
                or any(e for e in extra)):
            self.skipped += len(hashes)
            return
        held, key_of = self._held, self._key_of
        for n, block_hash in enumerate(hashes):
            key = hash((key, *tokens[n * size:(n + 1) * size]))
            before = key_of.get(block_hash)
            if before == key:
                continue  # announced again (vLLM's "full" report mode)
            if before is not None:
                self._release(before)
            key_of[block_hash] = key
            held[key] = held.get(key, 0) + 1

    def removed(self, event: dict) -> None:
        if event.get("medium") not in PRIMARY or (event.get("group_idx") or 0) != (self.group or 0):
            return
        for block_hash in event.get("block_hashes") or ():
            key = self._key_of.pop(block_hash, None)
            if key is not None:
                self._release(key)

    def cleared(self) -> None:
        self._key_of.clear()
        self._held.clear()

    def _release(self, key: int) -> None:
        left = self._held[key] - 1
        if left:
            self._held[key] = left
        else:
            del self._held[key]

    def cached_tokens(self, prompt: PromptBlocks, coming: dict | None = None, block_size: int | None = None) -> int:
        """`block_size`: the server's, until its events say it (with `coming`, a prompt on its way before any)."""
        size = self.block_size or block_size
        if not size or not (self._held or coming):
            return 0
        return _walk(prompt, size, self._held, coming) * size


class SentIndex:
    """The blocks looptrace sent a server, least recently used first out once past its capacity."""

    source = "estimate"

    def __init__(self, block_size: int = DEFAULT_BLOCK, capacity: int | None = None) -> None:
        self.block_size = block_size
        self.capacity = capacity  # blocks; None: unknown, unbounded
        self._held: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def resize(self, block_size: int, capacity: int | None) -> None:
        """The server's own figures, once known: keys of another block size are of no use, so it starts over."""
        if block_size != self.block_size:
            self._held.clear()
            self.block_size = block_size
        self.capacity = capacity
        self._trim()

    def sent(self, ids: list[int]) -> None:
        """A request's prompt and answer went through the server: their whole blocks are now its most recent."""
        held, size = self._held, self.block_size
        for key in PromptBlocks(ids).keys(size, len(ids) // size):
            held[key] = None
            held.move_to_end(key)
        self._trim()

    def cleared(self) -> None:
        self._held.clear()

    def _trim(self) -> None:
        if self.capacity is not None:
            while len(self._held) > self.capacity:
                self._held.popitem(last=False)

    def cached_tokens(self, prompt: PromptBlocks, coming: dict | None = None, block_size: int | None = None) -> int:
        if not (self._held or coming):
            return 0
        return _walk(prompt, self.block_size, self._held, coming) * self.block_size


def _walk(prompt: PromptBlocks, size: int, held, coming: dict | None = None) -> int:
    """How many of the prompt's leading blocks are held (or `coming`: being computed), stopping at the first that is
    not."""
    n = 0
    for key in prompt.keys(size, prompt.usable_blocks(size)):
        if key not in held and (not coming or key not in coming):
            break
        n += 1
    return n


class SharedPrefixes:
    """Which conversation sent each block first, for the most recent `limit` blocks: the leading blocks of a
    prompt that another conversation sent first are what it shares with others."""

    def __init__(self, limit: int = 262_144) -> None:
        self.limit = limit
        self._first: OrderedDict[int, str] = OrderedDict()  # block key → the conversation that sent it first

    def shared_tokens(self, conversation: str, prompt: PromptBlocks, block_size: int) -> int:
        first, shared, leading = self._first, 0, True
        for key in prompt.keys(block_size, len(prompt.ids) // block_size):
            sender = first.get(key)
            if sender is None:
                first[key] = conversation
            else:
                first.move_to_end(key)
            if leading and sender is not None and sender != conversation:
                shared += 1
            else:
                leading = False
        while len(first) > self.limit:
            first.popitem(last=False)
        return shared * block_size


class Holdings:
    """What one server is taken to hold: its events' index while they can be trusted, else the estimate.
    `events` is its KV-event reader (kv_events.KVEvents), or None for a server without events."""

    def __init__(self, events=None) -> None:
        self.events = events
        self.sent = SentIndex()
        self._coming: dict[int, int] = {}  # blocks of prompts sent it and not yet ended → how many hold each

    @property
    def index(self) -> EventIndex | SentIndex:
        events = self.events
        return events.index if events is not None and events.trusted else self.sent

    @property
    def block_size(self) -> int:
        return self.index.block_size or self.sent.block_size

    def predict(self, prompt: PromptBlocks) -> tuple[int, str]:
        """(prompt tokens predicted cached, which index said so: "events" or "estimate")."""
        index = self.index
        return index.cached_tokens(prompt, self._coming, self.sent.block_size), index.source

    def sending(self, prompt: PromptBlocks) -> list[int]:
        """A request goes out: its prompt's blocks count as held until it ends (`ended`, with what this returns)."""
        size = self.block_size
        keys = list(prompt.keys(size, prompt.usable_blocks(size)))
        coming = self._coming
        for key in keys:
            coming[key] = coming.get(key, 0) + 1
        return keys

    def ended(self, keys: list[int]) -> None:
        """The request ended: what it stored, its server's events (or the estimate) say from now on."""
        coming = self._coming
        for key in keys:
            left = coming.pop(key) - 1
            if left:
                coming[key] = left

    def served(self, prompt_ids: list[int], output_ids: list[int], cached: int, since: float) -> None:
        """A request sent at `since` (time.monotonic) finished on the server, `cached` of its prompt tokens found
        there (vLLM's count)."""
        # vLLM never computes the last token's keys and values: the blocks it filled end before it.
        self.sent.sent(prompt_ids + output_ids[:-1])
        if self.events is not None:
            size = self.block_size
            filled = (len(prompt_ids) + max(0, len(output_ids) - 1)) // size
            self.events.owed(filled > cached // size, since)  # it stored blocks: their events should have come

    def left(self) -> None:
        """The server stopped answering: what it held is unknown (it may be restarting, its cache emptied)."""
        self.sent.cleared()
        if self.events is not None:
            self.events.forget()

    def back(self) -> None:
        """It answers again: its events are read again from what it still keeps."""
        if self.events is not None:
            self.events.resync()

    def health(self) -> dict:
        """What /health says of it: which index routing reads now, and how its events are followed."""
        body = {"routing_index": self.index.source}
        if self.events is not None:
            body["kv_events"] = self.events.health()
        return body
