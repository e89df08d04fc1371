"""llama.cpp's prefix reuse (backends/llama_cpp/reuse.py) within a tenant's salt (issue 55): what the context
holds, and each state saved aside, is reused only by a prompt of the same salt. SmolLM2's GGUF through
the real binding, driven from this one thread (the backend's decode thread in the server)."""

from __future__ import annotations

import pytest

from looptrace.backends.llama_cpp.context import LlamaContext
from looptrace.backends.llama_cpp.reuse import PrefixReuse


@pytest.fixture(scope="module")
def context(smollm2_gguf_path):
    made = LlamaContext(str(smollm2_gguf_path), n_ctx=512, threads=1)
    yield made
    made.close()


def test_a_prompt_reuses_only_what_its_own_salt_left(context):
    reuse = PrefixReuse(context, max_tokens=4096, max_bytes=1 << 28)
    prompt = list(range(1000, 1080))

    def prefilled(salt: str | None) -> int:
        held = reuse.prepare(prompt, None, salt)
        context.eval(prompt[held:])
        return held

    assert prefilled("salt-a") == 0
    assert prefilled("salt-a") == len(prompt) - 1  # all but the last token, evaluated again for its logits
    assert prefilled("salt-b") == 0  # the same ids the context holds, another tenant: from nothing
    assert prefilled(None) == 0  # nor a request of no tenant
    # a's state was kept aside when b's prompt overwrote it, and comes back for a alone.
    assert prefilled("salt-a") == len(prompt) - 1
    assert prefilled("salt-b") == len(prompt) - 1
