"""The GPU benchmarks' CPU smoke runs (issue 46): bench/gpu_decode.py is written for a lent GPU, where device
time is short; here it runs end to end on the toy-width model, every step of it, so that it cannot rot
before a GPU is at hand. (gpu_decode.py's MTP step
had: its drafter handed 513 hidden states beside 512 tokens, a failure the GPU run would have met too.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer() -> Path:
    import build_cache
    import tiny_qwen3_5

    try:
        return tiny_qwen3_5.qwen3_5_tokenizer_dir()
    except (build_cache.MissingShared, build_cache.MissingPackage) as exc:  # as conftest's fixtures say it
        pytest.skip(str(exc))


def run(script: str, tokenizer: Path, folder: Path, *args: str) -> dict:
    out = folder / f"{script}.json"
    done = subprocess.run([sys.executable, f"bench/{script}.py", "--tokenizer", str(tokenizer), "--out", str(out),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    errors = {k: v for k, v in result.items() if k.endswith(("_error", "_traceback"))}
    assert not errors, errors  # each step reports its own failure and the script goes on: none may have
    assert result["device"].startswith("cpu")
    return result


def test_gpu_decode_runs_every_step_on_the_cpu(tokenizer, tmp_path):
    result = run("gpu_decode", tokenizer, tmp_path, "--prompt", "48", "--tokens", "12")
    rates = ("generate_tok_s", "eager_backend_decode_tok_s", "speculative_decode_tok_s", "suffix_decode_tok_s",
             "mtp_decode_tok_s")
    assert all(result[rate] > 0 for rate in rates), {rate: result.get(rate) for rate in rates}
    assert list(result["verify_pass_cost_vs_one_token"]) == [str(n) for n in range(1, 10)]
    costs = result["mtp_draft_cost_vs_model_step"]
    assert list(costs) == ["1", "3"] and all(cost > 0 for cost in costs.values()), costs

