"""A hybrid model's KV-cache groups (backends/vllm/routing/kv_groups.py): each group's blocks as vLLM 0.32's events
announce them (`group_idx`, `kv_cache_spec_kind`, `kv_cache_spec_sliding_window`), and the prefix vLLM's hybrid
coordinator finds cached across them: a full-attention prefix is no hit without the sliding window's last blocks or
the recurrent state at its end. Where the kinds leave it unsaid, the receipt says `estimate`. The expected hits are
worked out by hand from vLLM 0.32's managers (vllm/v1/core/single_type_kv_cache_manager.py: FullAttentionManager,
SlidingWindowManager, MambaManager, and vllm/v1/core/kv_cache_coordinator.py's fixed point)."""

from __future__ import annotations

from looptrace.backends.vllm.routing.kv_index import EventIndex, Holdings, PromptBlocks

BLOCK = 16
PROMPT = list(range(3000, 3000 + 10 * BLOCK + 1))  # ten whole blocks usable (vLLM computes the last token again)


def hashes(blocks: range) -> list[str]:
    return [f"b{n}" for n in blocks]  # vLLM's hash of block n: every group's the same (group_idx tells them apart)


def store(index: EventIndex, group: int, kind: str | None, blocks: range, window: int | None = None) -> None:
    """A BlockStored per run of blocks, chained to the block before it, as vLLM publishes a request's."""
    first = blocks.start
    index.stored({"type": "BlockStored", "block_hashes": hashes(blocks),
                  "parent_block_hash": f"b{first - 1}" if first else None,
                  "token_ids": PROMPT[first * BLOCK:blocks.stop * BLOCK], "block_size": BLOCK, "lora_id": None,
                  "medium": "GPU", "lora_name": None, "extra_keys": None, "group_idx": group,
                  "kv_cache_spec_kind": kind, "kv_cache_spec_sliding_window": window})


def remove(index: EventIndex, group: int, blocks: range) -> None:
    index.removed({"type": "BlockRemoved", "block_hashes": hashes(blocks), "medium": "GPU",
                   "group_idx": group})


def test_a_sliding_window_group_needs_the_blocks_its_window_reaches_back_to():
    index = EventIndex()
    store(index, 0, "full_attention", range(10))
    store(index, 1, "sliding_window", range(10), window=48)  # the last ceil(47 / 16) = 3 blocks before an end
    assert index.cached_tokens(PromptBlocks(PROMPT)) == 10 * BLOCK
    remove(index, 1, range(0, 5))  # out of the window: freed, then evicted
    remove(index, 1, range(8, 9))
    # vLLM's search from the right: blocks 7, 6, 5 held together end a hit of 8 blocks; full attention has them.
    assert index.cached_tokens(PromptBlocks(PROMPT)) == 8 * BLOCK and index.source == "events"
    remove(index, 1, range(6, 7))  # no three together any more, and block 0 gone: nothing
    assert index.cached_tokens(PromptBlocks(PROMPT)) == 0


def test_a_recurrent_state_group_needs_the_state_at_the_prefixs_end():
    index = EventIndex()
    store(index, 0, "full_attention", range(10))
    store(index, 1, "mamba", range(3, 4))  # the states kept: after blocks 3 and 6 (their parents: full attention's)
    store(index, 1, "mamba", range(6, 7))
    assert index.cached_tokens(PromptBlocks(PROMPT)) == 7 * BLOCK  # the last state held ends the hit
    remove(index, 0, range(6, 10))  # full attention keeps blocks 0-5: the state after block 6 serves nothing
    assert index.cached_tokens(PromptBlocks(PROMPT)) == 4 * BLOCK
    # The index of the full-attention group alone (what routing read before) predicted 6 blocks.
    assert index.groups[0].hit(list(PromptBlocks(PROMPT).keys(BLOCK, 10)), 10, None) == 6


def test_kinds_it_has_no_rule_for_make_the_receipt_say_estimate():
    class Events:
        trusted = True

        def __init__(self):
            self.index = EventIndex()

        def health(self):
            return {}

    events = Events()
    holdings = Holdings(events)
    store(events.index, 0, "full_attention", range(10))
    assert holdings.predict(PromptBlocks(PROMPT)) == (10 * BLOCK, "events")  # one group: what it says is exact
    store(events.index, 1, "chunked_local_attention", range(10))
    # The full-attention group's run, an upper bound, said plainly to be an estimate (and on /health).
    assert holdings.predict(PromptBlocks(PROMPT)) == (10 * BLOCK, "estimate")
    assert holdings.health()["routing_index"] == "estimate"
    assert events.index.kinds() == {0: "full_attention", 1: "chunked_local_attention"}


def test_a_group_without_a_kind_is_full_attention_alone_and_in_company_unsaid():
    index = EventIndex()
    store(index, 0, None, range(10))  # a vLLM older than the kinds, one group: as before, exact
    assert (index.cached_tokens(PromptBlocks(PROMPT)), index.source) == (10 * BLOCK, "events")
    store(index, 1, None, range(2))
    assert index.source == "estimate"


def test_a_sparse_groups_block_announced_before_its_parent_waits_for_it():
    # A sliding window's blocks are sparse: its event for blocks 8-9 names block 7 as parent, which only the
    # full-attention group holds, and whose event may come after it in the same batch.
    index = EventIndex()
    store(index, 1, "sliding_window", range(8, 10), window=32)  # waits for block 7
    assert index.cached_tokens(PromptBlocks(PROMPT)) == 0 and index.skipped == 2
    store(index, 0, "full_attention", range(10))
    # Placed once its parent is: a window of 32 tokens needs the two blocks before the prefix's end.
    assert index.cached_tokens(PromptBlocks(PROMPT)) == 10 * BLOCK and index.skipped == 0


def test_a_sparse_groups_event_as_vllm_sends_it_is_placed_by_the_full_groups_hashes():
    # vLLM 0.32's batch for one request of a tiny Gemma 4 (window 32, blocks of 32), as captured: the sliding
    # window's event first, carrying the tokens of the whole range it cached but the hash of the one block it keeps;
    # then full attention's, every block's hash. The kept block is found by its hash, every group's the same.
    size, window_block = 32, 8
    prompt = list(range(1000, 1000 + 9 * size + 12))
    index = EventIndex()
    common = {"type": "BlockStored", "parent_block_hash": None, "token_ids": prompt[:9 * size], "block_size": size,
              "lora_id": None, "medium": "GPU", "lora_name": None}
    index.stored({**common, "block_hashes": [f"h{window_block}"], "extra_keys": [None], "group_idx": 0,
                  "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 32})
    assert index.skipped == 1  # waiting for full attention's event to say where block h8 is
    index.stored({**common, "block_hashes": [f"h{n}" for n in range(9)], "extra_keys": [None] * 9, "group_idx": 1,
                  "kv_cache_spec_kind": "full_attention"})
    assert (index.skipped, len(index.groups[0].held), len(index.groups[1].held)) == (0, 1, 9)
    # The next request's prompt: what vLLM then reported cached (288 tokens: nine blocks), predicted.
    assert index.cached_tokens(PromptBlocks(prompt + list(range(5000, 5100)))) == 9 * size
    index.removed({"type": "BlockRemoved", "block_hashes": [f"h{window_block}"], "medium": "GPU", "group_idx": 0})
    # The window's block evicted (out of the window, freed first): full attention alone would still say 288.
    assert index.cached_tokens(PromptBlocks(prompt + list(range(5000, 5100)))) == 0
