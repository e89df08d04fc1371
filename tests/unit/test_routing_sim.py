"""bench/routing_sim.py, the instrument issue 44's simulated figures come from, still runs the pool's own code: a
short run of each workload, through the real pool, cost model and KV-event index, in front of simulated servers.
(A change to what the index hands its events reader once broke it, and no test ran it.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_simulation_runs_the_policies_and_predicts_every_cached_token():
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "routing_sim.py"), "--rounds", "1", "--turns", "3",
                          "--policies", "rendezvous", "cache-aware"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])["routing_sim"]
    for kind, sessions in (("even", 6), ("skewed", 4 + 2 * 2)):  # 4 light sessions, 2 busy ones of 2 laps
        rows = {r["policy"]: r for r in report["workloads"][kind]["rows"]}
        assert set(rows) == {"rendezvous", "cache-aware"}
        for row in rows.values():
            assert row["requests"] == 3 * sessions and row["failed"] == 0, row
            # The simulated servers publish every change at each step's end, as vLLM does: the index knows them.
            assert row["prediction_error"] == 0 and row["predicted_cached"] == row["cached"] > 0, row
        assert rows["rendezvous"]["moves"] == 0
