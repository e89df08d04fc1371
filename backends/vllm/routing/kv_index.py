"""What each vLLM server holds in its prefix cache, block by block, keyed on the tokens.

vLLM caches a prompt in blocks of `block_size` tokens and finds a block by a hash chained over every
block before it. looptrace never computes vLLM's hash (it depends on vLLM's version, its hash
function and a seed): it keys each block on its tokens, chained the same way (block_keys.py), so a
prompt's blocks are looked up by their tokens alone. A `BlockStored` event carries both its blocks'
tokens and vLLM's hashes: each hash is mapped to its key once, for the `BlockRemoved` events, which
carry hashes only. A hybrid model's KV-cache groups each hold their own blocks (kv_groups.py).

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
error). `SharedPrefixes` tells the part of a prompt it shares with other conversations (a system prompt, tool
definitions): every server holds that sooner or later, and routing finds a conversation's home by what it holds
beyond it.
"""

from __future__ import annotations

from collections import OrderedDict

from . import kv_groups
from .block_keys import PromptBlocks, walk

DEFAULT_BLOCK = 16  # vLLM's block size on GPUs, until the server says (its events, its /metrics)
PRIMARY = (None, "GPU")  # the engine's own cache; an offloading tier's events ("CPU", …) are not it
ORPHANS = 4096  # events kept waiting for their parent block (EventIndex)


class EventIndex:
    """The blocks a server's KV events say it holds, per KV-cache group (kv_groups.py: a hybrid model's groups
    each hold their own, and a prefix is a hit where all of them can serve it)."""

    def __init__(self) -> None:
        self.groups: dict[int, kv_groups.Group] = {}
        # Events waiting for a block another group's event places, by that block's hash: a sparse group's (a
        # window's, a state's) comes before the full-attention group's in vLLM's batch, and says its blocks by hash.
        self._orphans: OrderedDict[object, list[dict]] = OrderedDict()
        self._orphaned = 0  # blocks given up on, the orphans past ORPHANS
    def __len__(self) -> int:
        return sum(len(g.key_of) for g in self.groups.values())

    @property
    def block_size(self) -> int | None:
        return self.groups[min(self.groups)].block_size if self.groups else None

    @property
    def skipped(self) -> int:
        """Blocks of events it could not place: an unknown parent (waiting for it, or given up), media, LoRA."""
        waiting = sum(len(e.get("block_hashes") or ()) for events in self._orphans.values() for e in events)
        return sum(g.skipped for g in self.groups.values()) + self._orphaned + waiting

    @property
    def source(self) -> str:
        """"events" where they say exactly what the server will find; "estimate" where the groups' kinds or sizes
        leave it unsaid (kv_groups.exact)."""
        return "events" if kv_groups.exact(list(self.groups.values())) else "estimate"

    def kinds(self) -> dict[int, str | None]:
        return {n: g.kind for n, g in sorted(self.groups.items())}

    def stored(self, event: dict) -> None:
        if event.get("medium") not in PRIMARY or event.get("lora_name") or event.get("lora_id") is not None:
            return
        n = event.get("group_idx") or 0
        group = self.groups.get(n)
        if group is None:
            group = self.groups[n] = kv_groups.Group()
        waits_for = group.stored(event, self._key_of)
        if waits_for is not None:
            self._orphans.setdefault(waits_for, []).append(event)
            while len(self._orphans) > ORPHANS:
                _, lost = self._orphans.popitem(last=False)
                self._orphaned += sum(len(e.get("block_hashes") or ()) for e in lost)
            return
        for block_hash in event.get("block_hashes") or ():  # the events that waited for these, placed now
            for waiting in self._orphans.pop(block_hash, ()):
                self.stored(waiting)

    def _key_of(self, block_hash: object) -> int | None:
        for group in self.groups.values():
            key = group.key_of.get(block_hash)
            if key is not None:
                return key
        return None

    def removed(self, event: dict) -> None:
        group = self.groups.get(event.get("group_idx") or 0)
        if event.get("medium") in PRIMARY and group is not None:
            group.removed(event)

    def holds(self, key: int) -> bool:
        """Whether any group holds the block of this key (placed by its events)."""
        return any(key in g.held for g in self.groups.values())

    def cleared(self) -> None:
        self.groups.clear()
        self._orphans.clear()

    def cached_tokens(self, prompt: PromptBlocks, coming: dict | None = None, block_size: int | None = None) -> int:
        """`block_size`: the server's, until its events say it (with `coming`, a prompt on its way before any)."""
        groups = list(self.groups.values())
        if not groups:
            return walk(prompt, block_size, {}, coming) * block_size if coming and block_size else 0
        return kv_groups.cached_tokens(groups, prompt, coming)[0]


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

    def sent(self, blocks: PromptBlocks) -> None:
        """A request's prompt and answer went through the server: their whole blocks are now its most recent."""
        held, size = self._held, self.block_size
        for key in blocks.keys(size, len(blocks.ids) // size):
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
        return walk(prompt, self.block_size, self._held, coming) * self.block_size


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

    def served(self, prompt_ids: list[int], output_ids: list[int], cached: int, since: float,
               media: bool = False, salt: str | None = None) -> None:
        """A request sent at `since` (time.monotonic) finished on the server, `cached` of its prompt tokens found
        there (vLLM's count). `media`: its prompt's blocks from the first item on are keyed on more than their tokens,
        and the index cannot place them (kv_groups.py): the next request does not wait for their events. `salt`:
        the prompt's cache salt, which its blocks' keys start from (block_keys.py)."""
        # vLLM never computes the last token's keys and values: the blocks it filled end before it.
        blocks = PromptBlocks(prompt_ids + output_ids[:-1], salt)
        self.sent.sent(blocks)
        if self.events is not None:  # it stored blocks the cache did not hold: their events should come
            size = self.block_size
            filled = len(blocks.ids) // size
            stored = filled > cached // size
            self.events.owed(stored, since, blocks.key(size, filled - 1) if stored and not media else None)

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
