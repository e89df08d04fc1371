"""Suffix decoding (SuffixDecoding, from Snowflake's Arctic Inference; vLLM's method "suffix"): drafts
from what came after the same context before, in this request's prompt and output and in the
requests before it, weighted by how often each continuation followed.

Agent loops repeat themselves across turns: a file read is written back, a tool call takes the shape
of the last one, a plan is restated. Prompt lookup (ngram) copies what followed the latest earlier
occurrence of the last few tokens; suffix decoding looks at every occurrence of the longest suffix of
the context that occurred before (up to `suffix_decoding_max_tree_depth` tokens long), follows the
continuation most of them took, and stops where the observed frequency along that path falls below
`suffix_decoding_min_token_prob`; a draft is at most `suffix_decoding_max_spec_factor` × the length
of the match, so a short coincidence proposes little and a long repeat a lot.

Arctic keeps suffix trees; this keeps the sequences and, for a few n-gram lengths (ANCHORS), where
each n-gram ends in them: an occurrence of the longest suffix is found from the longest anchor that
matches, the match extended backwards by comparing tokens, and the candidates' continuations read
from the sequences themselves. The same answers as a tree's deepest node, without a node per
(position × depth). The index is keyed by the n-gram's hash, not the n-gram (a tuple of 8 costs 120
bytes), and an n-gram seen once holds its one entry without a list: about 200 bytes a token of
source code kept (the tokens included), up to twice that before dropped sequences' entries are
swept out. (Written by hand: Arctic's tree is C++, and vLLM calls it through its own package.)

What is kept (SuffixCache, on the backend's decode thread): each conversation's latest prompt with
its answer, as one sequence; the next turn, whose prompt starts with it, extends that sequence
rather than indexing the conversation again, so a turn costs its new tokens only (a turn whose
prompt does not start with it, the history compacted or edited, starts a sequence of its own; the
old one stays to draft from). Other conversations' sequences stay for later requests to draw on,
at most `suffix_decoding_max_cached_requests` of them and SUFFIX_MAX_TOKENS tokens in all, the
least recently used dropped first.
"""

from __future__ import annotations

from collections import OrderedDict

ANCHORS = (8, 4, 2)  # n-gram lengths indexed, the longest tried first
CANDIDATES = 32  # the most recent occurrences of a matched n-gram that are compared further
PREFIX = 32  # without a conversation id, earlier sequences are found by their first tokens
SHIFT = 32  # an index entry is (sequence id << SHIFT) | end position
MASK = (1 << SHIFT) - 1


class SuffixCache:
    """The sequences of recent requests and their n-gram index; one per backend."""

    def __init__(self, max_requests: int, max_tokens: int, depth: int, factor: float, min_prob: float) -> None:
        self.max_requests, self.max_tokens = max_requests, max_tokens
        self.depth, self.factor, self.min_prob = depth, factor, min_prob
        self.sequences: dict[int, list[int]] = {}
        self.index: dict[int, int | list[int]] = {}  # hash of an n-gram → its entry, or its entries in order
        self.tokens = 0  # in the live sequences
        self._entries = 0  # in the index, dropped sequences' included until it is rebuilt
        self._next_id = 1
        # id → its key (None: no longer a conversation's), least recently used first
        self._finished: OrderedDict[int, str | tuple | None] = OrderedDict()
        self._by_key: dict[str | tuple, list[int]] = {}

    def begin(self, prompt: list[int], conversation: str | None = None) -> SuffixDrafter:
        """A request's drafter: its sequence starts as the prompt, continuing the conversation's last
        one when the prompt starts with it."""
        found = self._earlier(prompt, conversation)
        if found is None:
            sid = self._new()
        else:
            sid = found
            self._unlist(sid)
        # Indexed when the first draft is asked for: the first token does not wait for it.
        return SuffixDrafter(self, sid, _key(prompt, conversation), prompt[len(self.sequences[sid]):])

    def _earlier(self, prompt: list[int], conversation: str | None) -> int | None:
        """The finished sequence this prompt continues (the conversation's last prompt and answer),
        or None. A conversation's sequence that the prompt does not continue (its history was
        rewritten: compacted, edited) is no longer the conversation's, but stays to draft from, as
        another request's does, until the bounds drop it."""
        key = _key(prompt, conversation)
        for sid in reversed(list(self._by_key.get(key, ()))):
            seq = self.sequences[sid]
            if len(seq) <= len(prompt) and prompt[:len(seq)] == seq:
                return sid
            if conversation is not None:  # in its place among the least recently used, under no key
                self._unkey(sid, key)
                self._finished[sid] = None
        return None

    def _new(self) -> int:
        sid = self._next_id
        self._next_id += 1
        self.sequences[sid] = []
        return sid

    def extend(self, sid: int, tokens: list[int]) -> None:
        """Appends tokens to a sequence, indexing the n-grams that end at each."""
        seq, index = self.sequences[sid], self.index
        base = sid << SHIFT
        for token in tokens:
            seq.append(token)
            end = len(seq)
            entry = base | end
            for n in ANCHORS:
                if end >= n:
                    key = hash(tuple(seq[end - n:end]))
                    held = index.get(key)
                    if held is None:
                        index[key] = entry
                    elif type(held) is int:
                        index[key] = [held, entry]
                    else:
                        held.append(entry)
                    self._entries += 1
        self.tokens += len(tokens)

    def finish(self, sid: int, key: str | tuple) -> None:
        """A request ended: its sequence stays for later requests, within the bounds."""
        self._finished[sid] = key
        self._by_key.setdefault(key, []).append(sid)
        while self._finished and (len(self._finished) > self.max_requests or self.tokens > self.max_tokens):
            self._drop(next(iter(self._finished)))

    def _unlist(self, sid: int) -> None:
        key = self._finished.pop(sid, None)
        if key is not None:
            self._unkey(sid, key)

    def _unkey(self, sid: int, key: str | tuple) -> None:
        listed = self._by_key[key]
        listed.remove(sid)
        if not listed:
            del self._by_key[key]

    def _drop(self, sid: int) -> None:
        """Forgets a sequence; its index entries go when dead ones outnumber the live (rebuilt then)."""
        self._unlist(sid)
        self.tokens -= len(self.sequences.pop(sid))
        if self._entries > 2 * len(ANCHORS) * max(self.tokens, 1024):
            self._rebuild()

    def _rebuild(self) -> None:
        # Each sequence stays the same list: a running request's drafter holds its own.
        self.index, self.tokens, self._entries = {}, 0, 0
        for sid, seq in self.sequences.items():
            tokens = seq[:]
            seq.clear()
            self.extend(sid, tokens)

    def stats(self) -> dict:
        return {"sequences": len(self.sequences), "tokens": self.tokens, "max_tokens": self.max_tokens,
                "max_requests": self.max_requests}


def _key(prompt: list[int], conversation: str | None) -> str | tuple:
    return conversation if conversation is not None else tuple(prompt[:PREFIX])


class SuffixDrafter:
    """One request's drafts: its sequence is the prompt and what it has generated so far. `probs` is
    None, as for prompt lookup: a draft is a certain proposal, and speculative sampling accepts it
    with the target's probability of it."""

    probs = None

    def __init__(self, cache: SuffixCache, sid: int, key: str | tuple, unindexed: list[int]) -> None:
        self.cache, self.sid, self.key = cache, sid, key
        self.seq = cache.sequences[sid]
        self.unindexed = list(unindexed)  # tokens of the request not in the index yet
        self.likelihood: list[float] = []  # each draft's frequency along the path, as proposed
        self.support = 0  # how many earlier occurrences that frequency was counted over

    def append(self, token: int) -> None:
        if self.unindexed:
            self.unindexed.append(token)
        else:
            self.cache.extend(self.sid, [token])

    def _catch_up(self) -> None:
        if self.unindexed:
            self.cache.extend(self.sid, self.unindexed)
            self.unindexed = []

    def propose(self, count: int) -> list[int]:
        """Up to `count` tokens: the continuation most occurrences of the longest matching suffix took,
        while its frequency stays at min_prob or above, and no longer than factor × the match."""
        self.likelihood, self.support = [], 0
        self._catch_up()
        found = self._candidates()
        if found is None:
            return []
        match, candidates = found
        self.support = len(candidates)
        cache = self.cache
        limit = min(count, int(cache.factor * match))
        drafts: list[int] = []
        prob = 1.0
        for j in range(limit):
            counts: dict[int, int] = {}
            for seq, end in candidates:  # newest first: a tie goes to the most recent continuation
                if end + j < len(seq):
                    token = seq[end + j]
                    counts[token] = counts.get(token, 0) + 1
            if not counts:
                break
            token = max(counts, key=counts.__getitem__)
            prob *= counts[token] / len(candidates)
            if prob < cache.min_prob:
                break
            drafts.append(token)
            self.likelihood.append(prob)
            candidates = [(seq, end) for seq, end in candidates if end + j < len(seq) and seq[end + j] == token]
        return drafts

    def _candidates(self) -> tuple[int, list[tuple[list[int], int]]] | None:
        """The longest earlier match of the sequence's suffix (up to the tree depth) and where each
        of its occurrences ends, newest first; None when not even the shortest anchor occurred."""
        cache, seq = self.cache, self.seq
        length, depth, sequences = len(seq), cache.depth, cache.sequences
        for n in ANCHORS:
            if length < n:
                continue
            anchor = seq[length - n:]
            held = cache.index.get(hash(tuple(anchor)))
            if held is None:
                continue
            found, seen = [], set()
            for entry in reversed((held,) if type(held) is int else held):
                sid, end = entry >> SHIFT, entry & MASK
                other = sequences.get(sid)
                if other is None or (sid == self.sid and end == length):  # dropped; the suffix itself
                    continue
                # Another n-gram of the same hash (of this length or another, whose entry may repeat one)
                if other[end - n:end] != anchor or entry in seen:
                    continue
                seen.add(entry)
                found.append((other, end))
                if len(found) == CANDIDATES:
                    break
            if found:
                break
        else:
            return None
        best, chosen = 0, []
        for other, end in found:
            m = n
            while m < depth and m < end and m < length and other[end - m - 1] == seq[length - m - 1]:
                m += 1
            m = min(m, depth)  # an anchor longer than the tree's depth counts as the depth
            if m > best:
                best, chosen = m, [(other, end)]
            elif m == best:
                chosen.append((other, end))
        return best, chosen

    def finish(self) -> None:
        """The request ended: its prompt and output stay for the conversation's next turn and others."""
        self._catch_up()
        self.cache.finish(self.sid, self.key)
