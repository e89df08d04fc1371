"""Makes ready, here, what a lent GPU machine needs to run bench/gpu_run.sh (docs/benchmarks.md, "On a GPU"):
the wheels its image lacks and the Qwen3.5 tokenizer the benchmarks' checkpoints use (looptrace itself is
installed there from the tree that travels).

    python bench/gpu_carry.py

Writes `.whl/` (the wheels) and `.device/qwen3_5-tokenizer/`, both in .gitignore (so that a run carries them
by name: `carry=[".whl", ".device"]`), and prints their size against the 64 MiB a run may carry. The machine's image (Python 3.12) has torch, aiohttp, numpy,
tokenizers, safetensors, jinja2, prometheus-client and pillow (/work/.library/device/KINDS.md), and
transformers 5.17: the versions carried are this environment's, the ones the tests ran with.
flash-linear-attention (fla-core and its layers, pure Python on Triton, which the image has) comes too,
for gpu_run.sh's `fla` step: transformers runs Qwen3.5's Gated DeltaNet with its kernels when it imports.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

WHEELS = ROOT / ".whl"
DEVICE = ROOT / ".device"
FLA = DEVICE / "fla"  # apart from .whl: gpu_run.sh installs them only for its `fla` step
# What looptrace and transformers 5.25 import that the image lacks or has too old (transformers 5.17,
# huggingface_hub 1.33: 5.25 needs 2.4, and with it httpx2); protobuf and regex at the versions asked for.
CARRIED = ("transformers", "huggingface_hub", "httpx2", "httpcore2", "truststore", "hf-xet", "kernels", "tomlkit",
           "click", "regex", "protobuf", "opentelemetry-api", "opentelemetry-sdk",
           "opentelemetry-semantic-conventions", "opentelemetry-proto", "opentelemetry-exporter-otlp-proto-http",
           "opentelemetry-exporter-otlp-proto-common", "opentelemetry-exporter-otlp-common",
           "opentelemetry-exporter-http-transport", "googleapis-common-protos", "orjson", "gguf", "platformdirs")
FLASH_LINEAR_ATTENTION = ("fla-core==0.6.0", "flash-linear-attention==0.6.0")
# The device README's download: CPython 3.12 wheels for the machine's x86-64 Linux.
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--platform",
            "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_17_x86_64",
            "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64", "--platform", "any"]
LIMIT = 64 * 1024 * 1024


def download(requirements: list[str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM, "-d", str(folder),
                    *requirements], check=True)


def size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main() -> None:
    import tiny_qwen3_5

    shutil.rmtree(WHEELS, ignore_errors=True)
    shutil.rmtree(DEVICE, ignore_errors=True)
    download([f"{name}=={importlib.metadata.version(name)}" for name in CARRIED], WHEELS)
    download(list(FLASH_LINEAR_ATTENTION), FLA)
    shutil.copytree(tiny_qwen3_5.qwen3_5_tokenizer_dir(), DEVICE / "qwen3_5-tokenizer",
                    ignore=shutil.ignore_patterns("looptrace-test-build.json"))
    carried = size(WHEELS) + size(DEVICE)
    for folder in (WHEELS, FLA):
        print(f"{folder.relative_to(ROOT)}: " + ", ".join(sorted(p.name.split("-")[0] for p in folder.glob("*.whl"))))
    print(f"carried: {carried / 2**20:.1f} MiB of {LIMIT / 2**20:.0f} MiB (with the tracked tree, which travels too)")
    if carried > LIMIT:
        sys.exit("too large to carry")


if __name__ == "__main__":
    main()
