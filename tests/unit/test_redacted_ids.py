"""A redacted prompt's ids: re-encoded only around each credential, on the real Qwen3.5 tokenizer."""

from __future__ import annotations

import random
import string

import pytest
from transformers import AutoTokenizer

from looptrace.common.redaction import Redactor
from looptrace.proxy.observe.redacted_ids import redacted_ids, same_count

import tiny_qwen3_5


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny_qwen3_5.qwen3_5_checkpoint()))


def _token(rnd: random.Random, n: int = 36) -> str:
    return "gh" + "p_" + "".join(rnd.choice(string.ascii_letters + string.digits) for _ in range(n))  # assembled


def _prompt(rnd: random.Random, secrets: list[str]) -> str:
    lines = ["<|im_start|>system\nYou are a coding agent.<|im_end|>\n<|im_start|>user\n"]
    for n in range(300):
        lines.append(f"src/module_{n}.py:{n}: def handler_{n}(request): return {n * 7}\n")
        if n in (40, 160, 161) and secrets:
            lines.append(f"GITHUB_TOKEN={secrets.pop()}\n")
    lines.append("<|im_end|>\n<|im_start|>assistant\n")
    return "".join(lines)


def _check(tokenizer, text: str, changed_at_most: int | None) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    redacted, found = Redactor(b"k" * 32).redact(text, keep_length=True)
    assert found
    out = redacted_ids(tokenizer, ids, text, redacted, found)
    decoded = tokenizer.decode(out, skip_special_tokens=False)
    assert len(out) == len(ids)
    for f in found:
        assert text[f.start:f.end] not in decoded
    assert "[REDACTED:" in decoded
    if changed_at_most is not None:
        assert sum(a != b for a, b in zip(ids, out)) <= changed_at_most
    return out


def test_only_the_credentials_runs_change(tokenizer):
    rnd = random.Random(1)
    text = _prompt(rnd, [_token(rnd) for _ in range(3)])
    _check(tokenizer, text, changed_at_most=400)  # of 7,733 ids (a whole re-encoding moves 6,600)


def test_a_credential_on_the_first_or_last_line_is_found_there(tokenizer):
    rnd = random.Random(2)
    for text in (f"GITHUB_TOKEN={_token(rnd)}\nand then", f"a line\nGITHUB_TOKEN={_token(rnd)}"):
        _check(tokenizer, text, changed_at_most=None)


def test_a_run_that_cannot_be_told_apart_falls_back_to_the_whole_prompt(tokenizer):
    rnd = random.Random(3)
    line = f"x\nGITHUB_TOKEN={_token(rnd)}\ny\n"
    text = line * 2  # the same lines twice: the first credential's run is found twice
    ids = tokenizer.encode(text, add_special_tokens=False)
    redacted, found = Redactor(b"k" * 32).redact(text, keep_length=True)
    assert redacted_ids(tokenizer, ids, text, redacted, found) == same_count(tokenizer, redacted, len(ids))
