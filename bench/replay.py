"""`looptrace replay` on a real codex session, end to end: how long each part takes, and the
screenshots docs/replay.md shows of the compare page.

    python bench/replay.py [--out docs] [--runs 3]

A real codex session is recorded on the tiny agent (tests/support/tiny_agent.py: a tiny Qwen3.5 that
calls exec_command, then answers; the local backend, this machine's CPU), then replayed with
`looptrace replay` against the same checkpoint (forced and step) and against a copy with its weights
nudged (forced), each RUNS times; the compare page of the original and the nudged replay is shot in
Chromium, with the session's links to it. Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
import sys

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs"))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    import clients
    import replays
    import tiny_agent
    from browser import Page, chromium
    from server import Server

    logs = Path(tempfile.mkdtemp(prefix="looptrace-replay-"))
    out = Path(args.out)
    started: list[Server] = []

    def serve(*command: str, **kwargs) -> Server:
        server = Server(*command, log_dir=logs, **kwargs)
        started.append(server)
        server.wait_ready(600)
        return server

    agent = tiny_agent.agent_checkpoint()
    nudged = tiny_agent.nudged(agent, logs / "agent-nudged", replays.NUDGE)
    try:
        began = time.perf_counter()
        recording = replays.record_codex_session(serve, clients.install(), logs, agent)
        recorded_seconds = time.perf_counter() - began
        same = serve(str(agent), "--served-model-name", replays.MODEL, api_key=replays.API_KEY)
        other = serve(str(nudged), "--served-model-name", replays.MODEL, api_key=replays.API_KEY)
        figures, reports = {}, {}
        for name, target, mode in (("same, forced", same, "forced"), ("same, step", same, "step"),
                                   ("nudged, forced", other, "forced")):
            times = []
            for run in range(args.runs):  # interleaved would mix the servers' caches; each run is whole
                began = time.perf_counter()
                done, report, _ = replays.replay(recording.store, recording.session, target.url, logs, mode,
                                                 name=f"{mode}-{name.split(',')[0]}-{run}")
                times.append(time.perf_counter() - began)
                assert report, replays.outcome(done)
            figures[name] = {"seconds": spread(times), "agreement": report["agreement"],
                             "first_divergence": report.get("first_divergence"),
                             "step_seconds": [s["seconds"] for s in report["steps"]],
                             "max_logprob_difference": max((s.get("max_logprob_difference") or 0.0)
                                                           for s in report["steps"])}
            reports[name] = report
        out.mkdir(parents=True, exist_ok=True)
        nudged_report = reports["nudged, forced"]
        with chromium() as browser:
            page = Page(browser, width=1400, height=900).page
            page.goto(recording.server.url + nudged_report["compare_path"])
            page.locator("#key-input").fill(replays.API_KEY)  # the recording server has a key: the page asks once
            page.locator("#key-form button[type=submit]").click()
            page.locator(".compare-summary").wait_for(timeout=120_000)
            first = nudged_report["first_divergence"]
            pair = page.locator("li.pair").nth(first["step"] - 1)
            token = pair.locator(".col").nth(1).locator(f".tok[data-i='{first['token']}']")
            token.scroll_into_view_if_needed()
            page.evaluate("window.scrollBy(0, -120)")
            token.hover()
            page.wait_for_selector("#tip:not([hidden])")
            page.screenshot(path=str(out / "viewer-compare.png"))
            page.goto(recording.server.url + "/sessions/" + recording.session)
            page.locator("li.step .tokens").first.wait_for(timeout=120_000)
            page.locator("summary", has_text="Compare with…").click()
            page.locator(".compare-with li a").first.wait_for()
            page.locator("summary", has_text="Replay against…").click()
            page.locator(".replay-against input[type=url]").fill("http://gpu-box:8000")
            page.locator(".session-head").screenshot(path=str(out / "viewer-compare-links.png"))
    finally:
        for server in started:
            server.stop()
    result = {"recorded_seconds": round(recorded_seconds, 1), "replays": figures,
              "screenshots": [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
                              for p in sorted(out.glob("viewer-compare*.png"))]}
    print(f"{'replay':<16} {'median s':>9} {'range s':>14} {'agreement':>10}  first divergence")
    for name, f in figures.items():
        s = f["seconds"]
        print(f"{name:<16} {s['median']:>9} {str(s['min']) + '–' + str(s['max']):>14} {f['agreement']:>10.4f}  "
              f"{f['first_divergence']}")
    print(json.dumps({"replay": result}))


if __name__ == "__main__":
    main()
