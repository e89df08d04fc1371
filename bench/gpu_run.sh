#!/usr/bin/env bash
# On a lent GPU machine (docs/benchmarks.md, "On a GPU"), after `python bench/gpu_carry.py` here:
#
#   run(command="bash bench/gpu_run.sh", carry=[".whl", ".device"], timeout_s=540)
#   run(command="bash bench/gpu_run.sh fla", carry=[".whl", ".device"], timeout_s=300)   # if time is left
#
# Installs the carried wheels and looptrace (from the tree that travelled) beside the image's packages, then
# runs the steps named (default: decode serve): `decode` bench/gpu_decode.py, `serve` bench/gpu_serve.py,
# `fla` gpu_decode.py again with flash-linear-attention's kernels for the Gated DeltaNet layers. Each step's
# JSON and log go to $OUT, with nvidia-smi's and the versions'.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-bench}
mkdir -p "$out"
if [ $# -eq 0 ]; then steps=(decode serve); else steps=("$@"); fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
  --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
# Nothing can be fetched there: transformers' hub kernels and the tokenizer stay local.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
tokenizer=.device/qwen3_5-tokenizer
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
python3 -c 'import torch, transformers, looptrace.proxy.cli; print(torch.__version__, transformers.__version__,
torch.version.cuda, torch.cuda.get_device_name())' 2>&1 | tee "$out/versions.txt"

for step in "${steps[@]}"; do
  started=$SECONDS
  case $step in
    decode) timeout 240 python3 bench/gpu_decode.py --tokenizer "$tokenizer" --out "$out/gpu_decode.json" \
              >"$out/gpu_decode.log" 2>&1 ;;
    serve) timeout 270 python3 bench/gpu_serve.py --tokenizer "$tokenizer" --out "$out/gpu_serve.json" \
             >"$out/gpu_serve.log" 2>&1 ;;
    fla) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fla \
           .device/fla/*.whl && PYTHONPATH=/tmp/fla:/tmp/site timeout 240 python3 bench/gpu_decode.py \
              --tokenizer "$tokenizer" --out "$out/gpu_decode_fla.json" >"$out/gpu_decode_fla.log" 2>&1 ;;
    *) echo "unknown step $step (decode, serve, fla)"; false ;;
  esac
  echo "$step: exit $? after $((SECONDS - started)) s"
done
# What failed inside a step (each reports its own errors and goes on): the JSON's *_error fields.
grep -h '_error"' "$out"/*.json 2>/dev/null
ls -la "$out"
