"""A vLLM server's KV-cache groups as its events say them, and the prefix its scheduler finds cached across them.

A model of one attention kind keeps one group. A hybrid one keeps a group per kind: Gemma 4's sliding-window layers
beside its full-attention ones, Qwen3.5's Gated DeltaNet layers (vLLM's mamba kind: a recurrent state, not keys and
values) beside its full attention. Each block is announced per group (`group_idx`), and vLLM 0.32 annotates every
BlockStored with its group's kind (`kv_cache_spec_kind`, `kv_cache_spec_sliding_window`: KVCacheManager.take_events).
A prefix is a hit only where every group can serve it (vLLM's HybridKVCacheCoordinator.find_longest_cache_hit, a
fixed point: each group shortens the candidate until none does):

    full attention (and MLA)   every block of the prefix held: the leading run
    sliding window W           the last ceil((W - 1) / block size) blocks before the prefix's end held (what its
                               last token attends to), or, where the leading run from the start is shorter than
                               that, the leading run
    mamba                      the state at the prefix's last block held: the longest prefix ending on a held block

A cached full-attention prefix without the recurrent state at its end is no hit: counting the full-attention group
alone would predict one. Where the kinds are not all of these, or the groups' block sizes differ (vLLM then aligns a
hit to their common multiple, with partial-block hashes this index does not follow), no rule is applied: the
prediction is the full-attention group's leading run (an upper bound), and `exact` says no.
"""

from __future__ import annotations

from .block_keys import ROOT, PromptBlocks, salted_root

RULES = {"full_attention": "full", "mla_attention": "full", "sliding_window": "window",
         "sliding_window_mla": "window", "mamba": "state"}


def salt_of(extra: object) -> str | None:
    """The cache salt a first block's extra keys hold, where they hold that alone: vLLM 0.32 publishes
    `[salt]` (untagged; media adds `[identifier, offset]` pairs, which are not placed)."""
    if isinstance(extra, (list, tuple)) and len(extra) == 1 and isinstance(extra[0], str):
        return extra[0]
    return None


class Group:
    """The blocks one KV-cache group holds: vLLM's hash of each → our key (its tokens, chained)."""

    def __init__(self) -> None:
        self.block_size: int | None = None
        self.kind: str | None = None  # vLLM's kv_cache_spec_kind, once an event says it
        self.window: int | None = None  # a sliding window's tokens
        self.key_of: dict[object, int] = {}
        self.held: dict[int, int] = {}  # our key → how many of vLLM's hashes hold it
        self.skipped = 0  # blocks of events that could not be placed (an unknown parent, media, LoRA)

    @property
    def rule(self) -> str | None:
        return RULES.get(self.kind) if self.kind is not None else None

    def stored(self, event: dict, key_of_any) -> object | None:
        """`key_of_any(hash)`: our key of a block hash any group holds (vLLM's hash of a block is every group's).
        Returns the block hash it waits for, where the event cannot be placed before another group's says it (its
        parent; or, for a sparse group, a block it keeps); None once placed (or given up: `skipped`)."""
        hashes, tokens = event.get("block_hashes") or [], event.get("token_ids") or []
        size, parent = event.get("block_size"), event.get("parent_block_hash")
        self.kind = event.get("kv_cache_spec_kind") or self.kind
        self.window = event.get("kv_cache_spec_sliding_window") or self.window
        if self.block_size is None:
            self.block_size = size
        key = ROOT if parent is None else key_of_any(parent)
        if key is None:
            return parent
        extra = list(event.get("extra_keys") or ())
        salt = salt_of(extra[0]) if parent is None and extra else None
        if salt is not None:  # a prompt's first block, salted: its chain starts where PromptBlocks' of that salt does
            key, extra[0] = salted_root(salt), None
        # A block of another size (a partial one) cannot be placed in the chain; nor can one whose hash took more
        # than its tokens and a salt (media): what follows them is unknown too.
        if size != self.block_size or not hashes or len(tokens) % size or any(e for e in extra):
            self.skipped += len(hashes)
            return None
        keys = []
        for n in range(len(tokens) // size):  # our key of every block of the event's range of tokens
            key = hash((key, *tokens[n * size:(n + 1) * size]))
            keys.append(key)
        if len(keys) == len(hashes):
            pairs = list(zip(hashes, keys))
        else:  # a sparse group's: the range's tokens, and the hashes of the blocks it keeps only (vLLM 0.32)
            pairs = []
            for block_hash in hashes:
                key = key_of_any(block_hash)
                if key is None:
                    return block_hash  # the group that holds every block (full attention) says where it is
                if key not in keys:
                    self.skipped += len(hashes)
                    return None
                pairs.append((block_hash, key))
        held, key_of = self.held, self.key_of
        for block_hash, key in pairs:
            before = key_of.get(block_hash)
            if before == key:
                continue  # announced again (vLLM's "full" report mode, or a reused prefix's report)
            if before is not None:
                self._release(before)
            key_of[block_hash] = key
            held[key] = held.get(key, 0) + 1
        return None

    def removed(self, event: dict) -> None:
        for block_hash in event.get("block_hashes") or ():
            key = self.key_of.pop(block_hash, None)
            if key is not None:
                self._release(key)

    def _release(self, key: int) -> None:
        left = self.held[key] - 1
        if left:
            self.held[key] = left
        else:
            del self.held[key]

    def hit(self, keys: list[int], n: int, coming: dict | None) -> int:
        """The blocks of a prefix of at most `n` (of `keys`) this group can serve, by its rule; `coming`: blocks of
        prompts on their way, which a full-attention group will hold by then (a window's or a state's: not said)."""
        held = self.held
        rule = self.rule or "full"
        if rule == "full":
            run = 0
            while run < n and (keys[run] in held or coming and keys[run] in coming):
                run += 1
            return run
        if rule == "state":
            return next((i + 1 for i in range(n - 1, -1, -1) if keys[i] in held), 0)
        need = max(1, -(-(self.window - 1) // self.block_size)) if self.window else 1
        run = 0
        for i in range(n - 1, -1, -1):  # vLLM's search, right to left
            run = run + 1 if keys[i] in held else 0
            if run >= need:
                return i + need
        return run  # the leading run, shorter than a window


def exact(groups: list[Group]) -> bool:
    """Whether the prefix the groups serve together can be predicted: one group, or kinds with a rule, one block
    size, and a full-attention group among them."""
    if len(groups) <= 1:
        return True
    rules = [g.rule for g in groups]
    return None not in rules and "full" in rules and len({g.block_size for g in groups}) == 1 and \
        all(g.rule != "window" or g.window for g in groups)


def cached_tokens(groups: list[Group], prompt: PromptBlocks, coming: dict | None) -> tuple[int, bool]:
    """(tokens of the prompt the server is predicted to find cached, whether that is exact)."""
    if not exact(groups):
        first = next((g for g in groups if g.rule == "full"), groups[0])
        usable = prompt.usable_blocks(first.block_size)
        return first.hit(list(prompt.keys(first.block_size, usable)), usable, coming) * first.block_size, False
    size = groups[0].block_size
    usable = prompt.usable_blocks(size)
    keys = list(prompt.keys(size, usable))
    ordered = sorted(groups, key=lambda g: g.rule != "full")  # full attention first, as vLLM's coordinator
    n, moved = usable, True
    while moved:
        moved = False
        for group in ordered:
            found = group.hit(keys, n, coming)
            if found < n:
                n, moved = found, True
    return n * size, True
