"""The speculative tests under other CPU kernel paths and thread counts: whether they hold only on the
kernels of the machine they ran on.

    python bench/kernel_matrix.py [--tests unit|integration|all] [--only NAME ...] [-- PYTEST ARGS]

Each row runs the speculative and MTP tests (tests/unit/test_speculative*.py; `--tests integration`, SmolLM2's
in tests/integration/test_speculative_smollm2.py) in a fresh process with one change: torch's thread count
(1, 2, 3), ATen's kernels forced to another instruction set (ATEN_CPU_CAPABILITY), MKL's BLAS to SSE4.2 or
to its bitwise-reproducible path (MKL_ENABLE_INSTRUCTIONS, MKL_CBWR), oneDNN to SSE4.1
(ONEDNN_MAX_CPU_ISA), or oneDNN off (torch.backends.mkldnn). Each changes how float32 sums are ordered,
which is all a verification pass and a plain step differ by. A row says what torch reported (its
capability, threads), the pytest summary, the largest difference between a verification's scores and plain
decoding's that the equality checks saw, the least headroom they had (the smallest lead of a winner over
what speculative_checks.py requires of it: 2 × HEADROOM × that check's difference; above 1 passes) and the
time. A row whose instruction set this CPU lacks is
skipped, saying so (torch takes ATEN_CPU_CAPABILITY=avx512 on a CPU without it, and dies of an illegal
instruction).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from speculative_checks import HEADROOM, ROUNDING  # noqa: E402
UNIT = ["tests/unit/test_speculative.py", "tests/unit/test_speculative_mtp.py",
        "tests/unit/test_speculative_sampling.py", "tests/unit/test_speculative_suffix.py"]
INTEGRATION = ["tests/integration/test_speculative_smollm2.py"]
TESTS = {"unit": UNIT, "integration": INTEGRATION, "all": UNIT + INTEGRATION}
# What assert_verified_as_plain prints (tests/support/speculative_checks.py); a check past ROUNDING in a row that
# passed is a mutant's, which must fail it, and is left out of the figures.
CHECK = re.compile(r"largest difference from plain decoding's scores (\S+) .*smallest lead of the winner (\S+) ")

# name: (environment, torch threads, oneDNN on, the CPU flags it needs)
ROWS = {
    "as is (2 threads)": ({}, 2, True, ()),
    "1 thread": ({}, 1, True, ()),
    "3 threads": ({}, 3, True, ()),
    "ATen default": ({"ATEN_CPU_CAPABILITY": "default"}, 2, True, ()),
    "ATen avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, 2, True, ("avx2",)),
    "ATen avx512": ({"ATEN_CPU_CAPABILITY": "avx512"}, 2, True, ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
    "MKL SSE4.2, oneDNN SSE4.1": ({"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"}, 2, True, ()),
    "MKL CBWR=COMPATIBLE": ({"MKL_CBWR": "COMPATIBLE"}, 2, True, ()),
    "oneDNN off": ({}, 2, False, ()),
}

# Run in the child: torch set up as the row says before pytest imports anything, then the tests.
# (torch.set_num_threads here reaches the backend's decode thread: each new thread takes torch's
# global count when it first runs a parallel kernel.)
CHILD = """
import sys, torch
threads, mkldnn = int(sys.argv[1]), sys.argv[2] == "1"
torch.set_num_threads(threads)
torch.backends.mkldnn.enabled = mkldnn
print(f"[row] capability={torch.backends.cpu.get_cpu_capability()} threads={torch.get_num_threads()} "
      f"mkldnn={torch.backends.mkldnn.enabled}", flush=True)
import pytest
sys.exit(pytest.main(["-q", "-s", "-p", "no:cacheprovider", *sys.argv[3:]]))
"""


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def run_row(name: str, paths: list[str], extra: list[str]) -> dict:
    environment, threads, mkldnn, needs = ROWS[name]
    lacking = [flag for flag in needs if flag not in cpu_flags()]
    if lacking:
        return {"row": name, "torch": "-", "summary": f"skipped: no {', '.join(lacking)}", "seconds": 0, "ok": True,
                "failed": [], "checks": 0, "difference": math.nan, "headroom": math.nan}
    env = {**os.environ, **environment, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", CHILD, str(threads), "1" if mkldnn else "0", *paths, *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    lines = done.stdout.splitlines()
    setup = next((line.removeprefix("[row] ") for line in lines if line.startswith("[row] ")), "?")
    summary = next((line.strip("= ") for line in reversed(lines) if " in " in line and (
        "passed" in line or "failed" in line or "error" in line)), f"exit {done.returncode}")
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    checks = [(float(difference), float(lead)) for difference, lead in CHECK.findall(done.stdout)
              if float(difference) < ROUNDING]
    room = [lead / (2 * HEADROOM * difference) for difference, lead in checks if difference > 0]
    return {"row": name, "torch": setup, "summary": summary, "seconds": round(time.monotonic() - started),
            "ok": done.returncode == 0, "failed": failed, "checks": len(checks),
            "difference": max((d for d, _ in checks), default=math.nan), "headroom": min(room, default=math.nan)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", choices=list(TESTS), default="unit", help="which speculative tests")
    parser.add_argument("--only", nargs="*", choices=list(ROWS), help="these rows only")
    parser.add_argument("pytest", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    paths = TESTS[args.tests]
    print(f"{'row':<26} {'torch':<44} {'result':<31} {'checks':>6} {'difference':>10} {'headroom':>8} seconds")
    results = []
    for name in args.only or ROWS:
        result = run_row(name, paths, args.pytest)
        results.append(result)
        print(f"{name:<26} {result['torch']:<44} {result['summary']:<31} {result['checks']:>6} "
              f"{result['difference']:>10.2e} {result['headroom']:>8.1f} {result['seconds']}", flush=True)
        for line in result["failed"]:
            print(f"    {line}")
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
