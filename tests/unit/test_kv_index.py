"""What each vLLM server holds (backends/vllm/routing/kv_index.py): the index its KV events build predicts exactly
what its prefix cache will find, through evictions and resets; what it cannot place (an unknown parent,
media, another medium) it leaves out rather than guesses; the estimate keeps what was sent, up to the
server's capacity. The events here are the vLLM double's (tests/support/kv_publisher.py), whose messages
tests/integration/test_real_vllm_routing.py checks against a real vLLM's."""

from __future__ import annotations

import random

from looptrace.backends.vllm.routing.kv_index import EventIndex, Holdings, PromptBlocks, SentIndex

from kv_publisher import PrefixCache

REMOVED = []  # every BlockRemoved fed, to tell that a workload evicted


def feed(index: EventIndex, events: list[dict]) -> None:
    REMOVED.extend(e for e in events if e["type"] == "BlockRemoved")
    for event in events:
        {"BlockStored": index.stored, "BlockRemoved": index.removed,
         "AllBlocksCleared": lambda _: index.cleared()}[event["type"]](event)


def serve(cache: PrefixCache, index: EventIndex, prompt: list[int], answer: list[int]) -> int:
    """One request through the cache, as the double serves it: the hit, then its blocks stored."""
    size = cache.block_size
    cached = cache.lookup(prompt)
    feed(index, cache.store(prompt, cached // size))
    feed(index, cache.store(prompt + answer[:-1], len(prompt) // size))
    return cached


def agent_turns(rng: random.Random, sessions: int, turns: int) -> list[tuple[int, list[int], list[int]]]:
    """(session, prompt, answer) of interleaved multi-turn sessions sharing a system prompt: each prompt is the
    session's last prompt, its answer, and a new message."""
    system = [rng.randrange(1000) for _ in range(70)]
    history = {s: list(system) for s in range(sessions)}
    out = []
    for _ in range(turns):
        s = rng.randrange(sessions)
        prompt = history[s] + [rng.randrange(1000) for _ in range(rng.randrange(5, 60))]
        answer = [rng.randrange(1000) for _ in range(rng.randrange(1, 40))]
        out.append((s, prompt, answer))
        history[s] = prompt + answer
    return out


def test_the_event_index_predicts_exactly_what_the_cache_finds_through_evictions_and_resets():
    rng = random.Random(7)
    cache, index = PrefixCache(block_size=16, capacity=120), EventIndex()
    hits = predicted_hits = 0
    REMOVED.clear()
    for n, (_, prompt, answer) in enumerate(agent_turns(rng, sessions=5, turns=300)):
        if n == 150:
            feed(index, cache.clear())  # vLLM's reset: AllBlocksCleared
        predicted = index.cached_tokens(PromptBlocks(prompt))
        actual = serve(cache, index, prompt, answer)
        assert predicted == actual, n
        hits += actual > 0
        predicted_hits += predicted
        assert len(index) == len(cache.blocks)
    assert hits > 100 and len(REMOVED) > 200 and predicted_hits > 0  # the workload hit, and evicted


def test_blocks_it_cannot_place_are_left_out():
    index = EventIndex()
    stored = {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None, "token_ids": list(range(32)),
              "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None, None],
              "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    index.stored(stored)
    prompt = PromptBlocks(list(range(40)))
    assert index.cached_tokens(prompt) == 32
    # A child of a block it never saw, a block of an image (extra keys), another tier's copy: not placed.
    index.stored({**stored, "block_hashes": [99], "parent_block_hash": 98, "token_ids": list(range(16))})
    index.stored({**stored, "block_hashes": [13], "parent_block_hash": 12, "token_ids": list(range(32, 48)),
                  "extra_keys": [("image-1", 0)]})
    index.stored({**stored, "block_hashes": [14], "parent_block_hash": 12, "token_ids": list(range(32, 48)),
                  "medium": "CPU"})
    assert len(index) == 2 and index.skipped == 2
    assert index.cached_tokens(PromptBlocks(list(range(60)))) == 32
    # Removing the first block breaks the chain for every prompt: nothing is found past a missing block.
    index.removed({"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU", "group_idx": 0})
    assert index.cached_tokens(prompt) == 0


def test_the_last_prompt_token_is_never_predicted_cached():
    cache, index = PrefixCache(block_size=16), EventIndex()
    serve(cache, index, list(range(32)), [1])
    # The same 32 tokens again: vLLM computes the last one anew, so only the first block is a hit.
    assert index.cached_tokens(PromptBlocks(list(range(32)))) == 16 == cache.lookup(list(range(32)))


def test_the_estimate_keeps_what_was_sent_most_recent_first_within_capacity():
    sent = SentIndex(block_size=16, capacity=4)
    a, b = list(range(64)), list(range(1000, 1064))
    sent.sent(PromptBlocks(a))
    assert sent.cached_tokens(PromptBlocks(a + [5])) == 64
    sent.sent(PromptBlocks(b))  # four blocks more: a's are the least recently used, and go
    assert sent.cached_tokens(PromptBlocks(a + [5])) == 0 and sent.cached_tokens(PromptBlocks(b + [5])) == 64
    sent.resize(32, 10)  # the server's own block size, once read from its /metrics: keys of 16 are of no use
    assert len(sent) == 0 and sent.block_size == 32


def test_holdings_read_the_events_while_they_are_trusted_else_the_estimate():
    class Events:
        def __init__(self):
            self.index, self.trusted, self.owed_calls = EventIndex(), True, []

        def owed(self, stored, since, last_block=None):
            self.owed_calls.append((stored, last_block))

    events = Events()
    holdings = Holdings(events)
    prompt, answer = list(range(40)), list(range(500, 530))
    holdings.served(prompt, answer, cached=0, since=0.0)
    # It filled blocks: events should follow, the last of them (tokens 48-63) awaited by the next request routed.
    assert events.owed_calls == [(True, PromptBlocks(prompt + answer).key(16, 3))]
    assert holdings.predict(PromptBlocks(prompt + answer)) == (0, "events")  # none came yet
    events.trusted = False
    assert holdings.predict(PromptBlocks(prompt + answer)) == (64, "estimate")
    holdings.served(list(range(10)), [1, 2], cached=0, since=0.0)
    assert events.owed_calls[-1] == (False, None)  # not a whole block: nothing to wait for
    holdings.served(prompt, answer, cached=0, since=0.0, media=True)
    assert events.owed_calls[-1] == (True, None)  # owed, but keyed on its media too: no block of it to wait for


def test_prompt_keys_are_computed_once_and_only_as_far_as_asked():
    prompt = PromptBlocks(list(range(100)))
    first = list(prompt.keys(16, 2))
    assert list(prompt.keys(16, 6))[:2] == first and len(prompt._keys[16]) == 6
    assert list(prompt.keys(16, 6)) == list(PromptBlocks(list(range(100))).keys(16, 6))
    assert list(prompt.keys(32, 1)) != first[:1]  # another block size, other keys


def test_a_prompt_on_its_way_counts_as_held_until_its_request_ends():
    # bench/routing.py's residual prediction error (5.8 % of prompt tokens, even workload): sessions start together,
    # a second conversation's first turn was routed while the first's was being read, predicted to miss the system
    # prompt both share, and found it cached (vLLM read the first turn's blocks a step before it). The request
    # ahead's blocks are held for what queues behind it.
    class Events:
        def __init__(self):
            self.index, self.trusted = EventIndex(), True

    holdings = Holdings(Events())
    system = list(range(1000, 1100))
    first, second = PromptBlocks(system + [1] * 20), PromptBlocks(system + [2] * 20)
    assert holdings.predict(second) == (0, "events")  # nothing held, nothing on its way
    coming = holdings.sending(first)  # before any event has said the server's block size: the estimate's (16)
    assert holdings.predict(second) == (96, "events")  # the six whole blocks of the shared system prompt
    other = holdings.sending(first)  # two requests on their way with the same blocks
    holdings.ended(coming)
    assert holdings.predict(second) == (96, "events")
    holdings.ended(other)
    assert holdings.predict(second) == (0, "events")  # ended: the events say what it stored from now on
