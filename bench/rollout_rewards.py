"""What posted rewards cost the server (issue 41, M1): one rollout, then POSTs of per-step rewards with
large `info`s, as anyone who reaches the port may send them.

    python bench/rollout_rewards.py [--posts 4] [--steps 1000] [--info-kb 60] [--rollout-steps 1]

A `looptrace serve` on the replay backend (the tiny Qwen3.5, its real vocabulary and template) with a
SQLite store of its own; one rollout of ROLLOUT_STEPS requests through its base URL; then POSTS posts
of STEPS steps each (each post the next STEPS places, so that posts add up; --same-steps: steps 1 to
STEPS every time), every step with an `info` of INFO_KB kilobytes. Reported: each post's status and answer size, the server's resident
memory (VmRSS, and its peak, VmHWM) before and after, the state file's size (with its write-ahead log), and the GET of the
reward (bytes, seconds). Before the bounds, the issue measured four posts of 1,000 × 60 KB: the state
store 294 MB, RSS 214 MB → 1.2 GB, the GET 229 MB in 3 s. Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))


def call(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes, float]:
    """(status, the answer's bytes, seconds) of one request."""
    request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    began = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, response.read(), time.perf_counter() - began
    except urllib.error.HTTPError as err:
        return err.code, err.read(), time.perf_counter() - began


def memory(pid: int) -> dict[str, int]:
    """The process's resident and peak resident memory, in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {name: int(fields[key].split()[0]) // 1024 for name, key in (("rss_mib", "VmRSS"), ("peak_mib", "VmHWM"))}


def run(args: argparse.Namespace, folder: Path) -> dict:
    from processes import Service, free_port
    from tiny_qwen3_5 import qwen3_5_checkpoint

    replay = folder / "steps.jsonl"
    replay.write_text((json.dumps({"text": "Hello there.<|im_end|>"}) + "\n") * args.rollout_steps)
    port, store = free_port(), folder / "traces.sqlite3"
    service = Service([sys.executable, "-m", "looptrace.proxy.cli", "serve", str(qwen3_5_checkpoint()), "--backend",
                       "replay", "--replay", str(replay), "--served-model-name", "m", "--port", str(port),
                       "--trace-db", str(store)], folder / "serve.log", cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        service.wait_until(lambda: _ready(url), 300)
        messages = [{"role": "user", "content": "Hi"}]
        for _ in range(args.rollout_steps):
            status, answer, _ = call("POST", f"{url}/r/bench/v1/chat/completions",
                                     json.dumps({"model": "m", "messages": messages}).encode())
            assert status == 200, answer[:500]
            messages += [json.loads(answer)["choices"][0]["message"], {"role": "user", "content": "More"}]
        time.sleep(1)  # the trace store writes a moment after the answer
        before = memory(service.process.pid)
        info = {"blob": "x" * (args.info_kb * 1000)}
        posts = []
        for post in range(args.posts):
            first = 1 + (0 if args.same_steps else post * args.steps)
            body = json.dumps({"steps": [{"step": n, "reward": 0.5, "info": info}
                                         for n in range(first, first + args.steps)]}).encode()
            status, answer, seconds = call("POST", f"{url}/v1/rollouts/bench/reward", body)
            posts.append({"status": status, "sent_mb": round(len(body) / 1e6, 1), "answer_bytes": len(answer),
                          "seconds": round(seconds, 2), "said": json.loads(answer).get("error", {}).get("message")})
        status, reward, seconds = call("GET", f"{url}/v1/rollouts/bench/reward")
        after = memory(service.process.pid)
        state = [store.with_name(f"{store.stem}.state{store.suffix}{wal}") for wal in ("", "-wal")]
        return {"benchmark": "rollout_rewards", "posts": posts, "before": before, "after": after,
                "state_store_mb": round(sum(p.stat().st_size for p in state if p.exists()) / 1e6, 1),
                "get": {"status": status, "mb": round(len(reward) / 1e6, 1), "seconds": round(seconds, 2)}}
    finally:
        service.stop()


def _ready(url: str) -> bool:
    try:
        return json.loads(call("GET", url + "/health")[1]).get("status") == "ready"
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1000, help="steps each post names, from 1")
    parser.add_argument("--info-kb", type=int, default=60, help="each step's info, in kilobytes")
    parser.add_argument("--rollout-steps", type=int, default=1, help="requests the rollout makes first")
    parser.add_argument("--same-steps", action="store_true",
                        help="every post names steps 1 to STEPS (replacing); by default each names the next STEPS")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        found = run(args, Path(folder))
    for n, post in enumerate(found["posts"], 1):
        print(f"post {n}: {post['status']} ({post['sent_mb']} MB sent, {post['answer_bytes']:,} bytes back, "
              f"{post['seconds']} s){': ' + post['said'] if post['said'] else ''}")
    print(f"server RSS {found['before']['rss_mib']} → {found['after']['rss_mib']} MiB (peak {found['after']['peak_mib']}); "
          f"state store {found['state_store_mb']} MB; GET reward {found['get']['mb']} MB in {found['get']['seconds']} s")
    print(json.dumps(found))


if __name__ == "__main__":
    main()
