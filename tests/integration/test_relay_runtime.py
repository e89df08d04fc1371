"""A relay process carries no model runtime (proxy/engine/model_runtime.py): `looptrace serve` with the
vllm or replay backend never loads torch, nor transformers' model code, read from outside the process
(its memory maps, its resident size) and from its start-up line; a checkpoint that reads video lets
torch in for its video processor and says so, and `--media-max-video-frames 0` keeps it out again while
images still reach the model."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from server import free_port
from tiny_media import mp4, with_images
from vllm_double import DoubleProcess

KEPT_OUT = "model runtime kept out: torch not imported, transformers' model code not imported"
# The goal was 150 MiB; a relay of the 248,000-token Qwen3.5 vocabulary measures 185–215 MiB
# here (its tokenizers' own tables are 85 MiB; docs/backends.md, "A relay holds no model runtime"). This
# bound catches torch coming back (it alone takes a relay to 440–550 MiB).
RSS_BOUND_MIB = 256


def status_of(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(rest.split()[0]) // 1024  # MiB
    return fields


def torch_libraries(pid: int) -> set[str]:
    """torch's shared libraries mapped into the process: what importing torch leaves behind."""
    return {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if "/torch/" in line and ".so" in line}


@pytest.fixture(scope="module")
def double(qwen3_5_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("relay-double")
    started = DoubleProcess(qwen3_5_dir, port=free_port(), log_path=logs / "double.log", fast=True)
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def chat(server, **extra) -> tuple[int, dict]:
    model = server.get("/health")[1]["model"]
    return server.post("/v1/chat/completions", {"model": model, "max_tokens": 8, "temperature": 0, **extra,
                                                "messages": extra.pop("messages", None) or [
                                                    {"role": "user", "content": "Hello there."}]})


def test_a_vllm_relay_holds_no_torch(serve, double):
    server = serve("--backend", "vllm", "--vllm-url", double.url)
    status, answer = chat(server)
    assert status == 200 and answer["choices"][0]["message"]
    pid = server.process.pid
    assert torch_libraries(pid) == set()
    assert KEPT_OUT in server.log()
    memory = status_of(pid)
    print(f"vLLM relay: {memory}")  # shown with -s: the figure docs/backends.md quotes
    assert memory["VmRSS"] <= RSS_BOUND_MIB, memory


def test_a_replay_relay_holds_no_torch(serve, qwen3_5_dir, tmp_path):
    steps = tmp_path / "steps.jsonl"
    steps.write_text(json.dumps({"text": "Fine.<|im_end|>"}) + "\n")
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(steps))
    assert chat(server)[0] == 200
    assert torch_libraries(server.process.pid) == set()
    assert KEPT_OUT in server.log()
    assert status_of(server.process.pid)["VmRSS"] <= RSS_BOUND_MIB


def test_a_checkpoint_that_reads_video_lets_torch_in_unless_video_is_left_out(serve, qwen3_5_dir, tmp_path):
    folder = with_images(qwen3_5_dir, "qwen3_5")
    logs = tmp_path / "double"
    logs.mkdir()
    double = DoubleProcess(folder, port=free_port(), log_path=logs / "double.log", fast=True)
    try:
        double.wait_ready()
        with_video = serve("--backend", "vllm", "--vllm-url", double.url)
        assert "importing torch: " in with_video.log() and "reads video" in with_video.log()
        assert torch_libraries(with_video.process.pid)
        with_video.stop()

        without = serve("--backend", "vllm", "--vllm-url", double.url, "--media-max-video-frames", "0")
        assert KEPT_OUT in without.log() and torch_libraries(without.process.pid) == set()
        png = io.BytesIO()
        Image.new("RGB", (64, 48), (20, 120, 200)).save(png, "PNG")
        image = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
        video = "data:video/mp4;base64," + base64.b64encode(mp4()).decode()
        status, answer = chat(without, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": image}}]}])
        assert status == 200, answer  # images need no torch: their processors run on PIL
        status, answer = chat(without, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is it?"}, {"type": "video_url", "video_url": {"url": video}}]}])
        assert status == 400 and answer["error"]["code"] == "media_unsupported", answer
        assert torch_libraries(without.process.pid) == set()
    finally:
        double.stop()
