"""A relay reads the checkpoint's tokenizer.json as it is (proxy/engine/runtime.py `_tokenizer`), not
through the model's own tokenizer class, which rebuilds the same tokenizer and keeps Python copies of
its vocabulary and merges. Whatever the server reads from a tokenizer must then be the same from both:
pieces, special and added tokens, stop and control ids, encodings (control tokens typed as text too),
decodings, and the rendered prompt, with tools and thinking on and off, through the family."""

from __future__ import annotations

import random

import pytest

from looptrace.common import checkpoint as ckpt
from looptrace.families import family_for_config
from looptrace.proxy.engine.runtime import _tokenizer

import load_once

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}}}}}]


def conversation(added: list[str]) -> list[dict]:
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"Read ß日本 {added[0]} and {added[-1]} please"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "read_file", "arguments": {"path": "a.py", "lines": 3}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": f"x = 1 {added[1]}\n"},
        {"role": "user", "content": "Thanks."},
    ]


@pytest.fixture(params=["qwen3_5_dir", "gemma4_dir"])
def pair(request):
    folder = request.getfixturevalue(request.param)
    checkpoint = ckpt.read_config(str(folder), None)
    lean = _tokenizer(ckpt.fetch(checkpoint, weights=False), checkpoint, lean=True)
    return checkpoint, load_once.tokenizer(folder), lean


def test_the_relays_tokenizer_reads_as_the_models_own(pair):
    checkpoint, own, lean = pair
    assert type(lean).__name__ == "TokenizersBackend"
    a, b = load_once.vocabulary(own), load_once.vocabulary(lean)
    assert a.pieces == b.pieces and a.special == b.special
    assert own.added_tokens_encoder == lean.added_tokens_encoder
    assert (own.eos_token_id, own.bos_token_id, own.pad_token_id) == (lean.eos_token_id, lean.bos_token_id,
                                                                      lean.pad_token_id)
    added = list(own.added_tokens_encoder)
    rng = random.Random(5)
    texts = ["", " leading", "trailing  ", "tabs\tand\nnewlines\r\n", "ünïcødé ß 日本語 😀", "".join(added),
             *("".join(rng.choice([chr(rng.randint(32, 0x30FF)), rng.choice(added), " ", "\n", "ab"])
                       for _ in range(rng.randint(1, 80))) for _ in range(200))]
    for text in texts:
        ids = own.encode(text, add_special_tokens=False)
        assert lean.encode(text, add_special_tokens=False) == ids, text
        assert lean.decode(ids) == own.decode(ids)


def test_the_family_renders_the_same_prompt_from_either(pair):
    checkpoint, own, lean = pair
    family = family_for_config(checkpoint.config)
    with_own, with_lean = family(own), family(lean)
    assert with_own.stop_token_ids == with_lean.stop_token_ids and with_own.grammar_ids == with_lean.grammar_ids
    messages = conversation(list(own.added_tokens_encoder))
    for thinking in (True, False):
        for tools in (TOOLS, None):
            one = with_own.render(messages, tools, enable_thinking=thinking)
            other = with_lean.render(messages, tools, enable_thinking=thinking)
            assert (one.text, one.ids) == (other.text, other.ids)
