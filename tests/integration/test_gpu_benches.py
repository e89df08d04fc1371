"""The GPU benchmarks' CPU smoke runs (issue 46): bench/gpu_decode.py and bench/gpu_serve.py are written for a
lent GPU (bench/gpu_run.sh, docs/benchmarks.md), where device time is short; here each runs end to end on the
toy-width model, every step of it, so that neither can rot before a GPU is at hand. (gpu_decode.py's MTP step
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


def test_gpu_serve_runs_every_step_on_the_cpu(tokenizer, tmp_path):
    result = run("gpu_serve", tokenizer, tmp_path, "--prompt", "48", "--tokens", "12", "--runs", "1")
    for mode in ("plain", "suffix"):
        figures = result[mode]
        for part in ("in_process", "served", "served_top5"):
            measured = figures[part]
            assert measured["decode_tok_s"] > 0 and measured["ttft_s"] > 0 and measured["tokens"] == [12], (mode, part)
        assert figures["served"]["server_cpu_ms_per_token"] > 0 and figures["served_vs_in_process"] > 0
        # The backend serve builds and the one built here, with the same settings, given the same prompt ids on
        # the same CPU: the same operations in the same order, so the same greedy tokens. Serving must not
        # change what the model reads.
        assert figures["served_equals_in_process"], mode
        assert figures["spans_dropped"] == 0, mode
