"""bench/routing.py's account of a round's slowest request: the crowd it met, by server, from the client's timings
and the receipts read back (issue 44's p99 at 64 requests a round is the round's slowest)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_routing", ROOT / "bench" / "routing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def turn(session: str, n: int, sent: float, ttft: float | None, prompt: int, cached: int) -> dict:
    return {"session": session, "turn": n, "sent": sent, "ttft": ttft, "prompt": prompt, "cached": cached,
            "error": None}


def test_the_slowest_request_is_told_with_the_requests_that_waited_beside_it_by_server():
    bench = load_bench()
    results = [
        turn("a", 0, 0.0, 1.0, 200, 0), turn("a", 1, 2.0, 9.0, 1100, 500),  # the slowest: waits 2.0 → 11.0
        turn("b", 0, 0.1, 1.2, 200, 100), turn("b", 1, 2.5, 8.0, 1100, 500),  # beside it, same server
        turn("c", 0, 0.0, 0.5, 200, 100), turn("c", 1, 10.5, 3.0, 900, 600),  # on the other, overlaps its end
        turn("d", 0, 11.5, 1.0, 300, 0),  # sent after its first token: not in the crowd
        turn("e", 0, 1.0, None, 300, 0),  # failed: no first token, no wait to overlap
    ]
    receipts = [{"conversation": c, "server": port} for c, port in
                (("a", 1), ("a", 1), ("b", 1), ("b", 1), ("c", 2), ("c", 2), ("d", 2), ("e", 1))]
    found = bench.slowest(results, receipts)
    assert found["conversation"] == "a" and found["turn"] == 1 and found["server"] == 1 and found["ttft"] == 9.0
    assert found["crowd"] == {"1": {"requests": 2, "uncached_tokens": 600 + 600},
                              "2": {"requests": 1, "uncached_tokens": 300}}


def test_a_conversation_moved_between_its_turns_is_placed_turn_by_turn():
    bench = load_bench()
    results = [turn("a", 0, 0.0, 1.0, 200, 0), turn("a", 1, 1.5, 4.0, 700, 0), turn("b", 0, 2.0, 1.0, 200, 0)]
    receipts = [{"conversation": "a", "server": 1}, {"conversation": "a", "server": 2},
                {"conversation": "b", "server": 2}]
    found = bench.slowest(results, receipts)
    assert found["server"] == 2
    assert found["crowd"] == {"2": {"requests": 2, "uncached_tokens": 900}}
