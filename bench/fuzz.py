"""tests/unit/test_fuzz.py with a large budget: many more examples than CI runs, drawn afresh each run.

    python bench/fuzz.py [--examples 2000]

Runs the fuzz tests (both endpoints: any body at all, and hostile strings in a well-formed
conversation) with LOOPTRACE_FUZZ_EXAMPLES examples each, then reports the requests tried by test,
endpoint and status class, the failures pytest found (each with hypothesis's smallest example in
its output), and the time taken. Exits with pytest's status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="examples per test (CI runs 40)")
    args = parser.parse_args()
    report = Path(tempfile.mkdtemp(prefix="looptrace-fuzz-")) / "tried.jsonl"
    env = {**os.environ, "LOOPTRACE_FUZZ_EXAMPLES": str(args.examples), "LOOPTRACE_FUZZ_REPORT": str(report)}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:logging", "-p", "no:cacheprovider",
                             "tests/unit/test_fuzz.py"], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    tried: Counter = Counter()
    if report.exists():
        for line in report.read_text().splitlines():
            tried.update(json.loads(line))
    failed = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("FAILED")]
    for key in sorted(tried):
        print(f"{tried[key]:>8}  {key}")
    print(f"{sum(tried.values()):>8}  requests in {seconds:.0f} s; failures: {len(failed)}")
    if result.returncode:
        print(result.stdout[-20_000:])
    print(json.dumps({"examples": args.examples, "requests": sum(tried.values()), "seconds": round(seconds),
                      "failed": failed, "tried": dict(tried)}))
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
