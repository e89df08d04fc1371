"""What the relay benchmark's runs of one target at one level come to, and its table."""

from __future__ import annotations

import math
import statistics


def summarize(runs: list[dict], proxy_cpu: float | None) -> dict:
    results = [r for run_ in runs for r in run_["results"]]
    ttft = sorted(r[0] for r in results)
    tokens = sum(r[2] for r in results)
    rates = sorted(sum(r[2] for r in run_["results"]) / run_["wall"] for run_ in runs)
    row = {
        "requests": len(results), "tokens": tokens,
        "ttft_p50_ms": round(statistics.median(ttft) * 1000, 2),
        "ttft_p99_ms": round(ttft[min(len(ttft) - 1, math.ceil(0.99 * len(ttft)) - 1)] * 1000, 2),
        "tokens_per_s": round(statistics.median(rates), 1),
        "tokens_per_s_range": [round(rates[0], 1), round(rates[-1], 1)],
        "per_stream_tokens_per_s": round(statistics.median(r[2] / (r[3] - r[0]) for r in results), 1),
        "upstream_cpu_s_per_1k_tokens": round(sum(x["upstream_cpu"] for x in runs) / tokens * 1000, 4),
        "client_cpu_s_per_1k_tokens": round(sum(x["client_cpu"] for x in runs) / tokens * 1000, 4),
    }
    if proxy_cpu is not None:
        row["proxy_cpu_s_per_1k_tokens"] = round(proxy_cpu / tokens * 1000, 4)
    return row


def print_table(levels: list[dict]) -> None:
    """One line per level and target; "added" is over direct, "range" the rounds' slowest and fastest."""
    print(f"{'streams':>7} {'target':<13} {'TTFT p50':>9} {'p99':>9} {'added p50':>9} {'p99':>9} {'tok/s':>8} "
          f"{'range':>13} {'tok/s/stream':>12} {'proxy CPU':>9} {'upstream':>8}")
    print(f"{'':>7} {'':<13} {'ms':>9} {'ms':>9} {'ms':>9} {'ms':>9} {'':>8} {'':>13} {'':>12} "
          f"{'s/1k tok':>9} {'s/1k tok':>8}")
    for level in levels:
        for name, r in level["targets"].items():
            low, high = r["tokens_per_s_range"]
            cpu = r.get("proxy_cpu_s_per_1k_tokens")
            print(f"{level['streams']:>7} {name:<13} {r['ttft_p50_ms']:>9.2f} {r['ttft_p99_ms']:>9.2f} "
                  f"{_ms(r.get('added_ttft_p50_ms'))} {_ms(r.get('added_ttft_p99_ms'))} {r['tokens_per_s']:>8.0f} "
                  f"{f'{low:.0f}–{high:.0f}':>13} {r['per_stream_tokens_per_s']:>12.0f} "
                  f"{'-' if cpu is None else f'{cpu:.3f}':>9} {r['upstream_cpu_s_per_1k_tokens']:>8.3f}")


def _ms(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value:>+9.2f}"
