"""What one request of a given size costs the server in memory, and what its trace keeps.

    python bench/prompt_memory.py [--sizes-mb 0.25 0.5 1 2 4 10 50 200]
    python bench/prompt_memory.py items [--kinds messages tools ...] [--counts 200000 2000000]
    python bench/prompt_memory.py images

Each row is one request to a fresh `looptrace serve` (the replay backend with the tiny Qwen3.5 test
checkpoint: the real Qwen3.5 tokenizer and template, 262,144 tokens of context). Reported per row:
the answer (its status, and for a 400 how it was found), the time to answer, and the server's peak
RSS above its RSS when idle (VmHWM, reset after loading, less VmRSS before the request).

- prompt sizes: one user message of that many megabytes of this repository's manual (README.md and
  docs/), repeated (about 3.5 bytes per token); "at least" is the check before rendering
  (families/prompt_length.py); also the bytes its trace holds in the store.
- items (issue 31): a body of N items of one kind, each as small as the API takes it (messages,
  tools, schema properties, past calls, their argument keys, content parts, Responses input items:
  tests/support/many_items.py).
- images (issue 31): PNGs of 5,792 × 5,792 (33.5 MP, the default --media-max-pixels), through the
  checkpoint's real image processing: one past a context of 8,192, four at once, one that fits.

A request that passes --stop-mb of RSS or --stop-s is stopped (its server killed) and reported as
such: run against the code before issue 31, one of these reached 9.6 GB. To measure a tree other than
this one, run this file with a Python whose `looptrace` is that tree (a venv with it installed
editable): the server started is the `looptrace` beside that Python. Prints a table, then JSON lines.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

MB = 1_000_000


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def prompt(size: int) -> str:
    text = "".join(path.read_text() for path in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))))
    return (text * (size // len(text) + 1))[:size]


def stored_bytes(path: Path) -> int:
    """The trace's spans and events as stored (the only trace in this store)."""
    with sqlite3.connect(path) as db:
        spans = db.execute("SELECT COALESCE(SUM(LENGTH(attributes) + LENGTH(COALESCE(events, ''))), 0) "
                           "FROM spans").fetchone()[0]
    return spans


def measured(checkpoint: str, path: str, body: bytes, args: argparse.Namespace, *extra: str) -> dict:
    """One request to a fresh server: status, seconds, peak RSS over idle, how its length was found."""
    from server import Server

    logs = Path(tempfile.mkdtemp(prefix="looptrace-prompt-"))
    replay = logs / "steps.jsonl"
    replay.write_text(json.dumps({"text": "Ok.<|im_end|>"}) + "\n")
    server = Server(checkpoint, "--backend", "replay", "--replay", str(replay), "--served-model-name", "m",
                    "--log-level", "warning", *extra, log_dir=logs)
    try:
        server.wait_ready(600)
        pid = server.process.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak so far (loading) is forgotten
        idle_kb = status_kb(pid, "VmRSS")
        stopped: list[str] = []
        peak = [0]
        done = threading.Event()

        def watch() -> None:  # the stop: past --stop-mb or --stop-s, the server is killed
            started = time.monotonic()
            while not done.wait(0.2):
                try:
                    over = (status_kb(pid, "VmRSS") - idle_kb) / 1024
                except (OSError, KeyError):
                    return
                if over > args.stop_mb or time.monotonic() - started > args.stop_s:
                    stopped.append(f"stopped past {args.stop_mb} MB" if over > args.stop_mb else
                                   f"stopped after {args.stop_s} s")
                    peak[0] = status_kb(pid, "VmHWM")
                    server.process.kill()
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.perf_counter()
        try:
            status, answer = server.request("POST", path, raw=body, timeout=args.stop_s + 60)
        except TimeoutError:  # a server too busy to be stopped in time: reported as stopped
            stopped.append(f"no answer after {args.stop_s + 60:g} s")
            status, answer = 0, {}
        seconds = time.perf_counter() - started
        if not peak[0]:
            try:
                peak[0] = status_kb(pid, "VmHWM")
            except (OSError, KeyError):  # gone
                peak[0] = idle_kb
        done.set()
        watcher.join()
        message = answer.get("error", {}).get("message", "") if status not in (200, 0) else ""
        found = ("before rendering" if "at least" in message else "rendered" if "resulted in" in message
                 else answer.get("error", {}).get("code", "-") if message else "-")
        row = {"status": stopped[0] if stopped else status, "seconds": round(seconds, 2), "found": found,
               "peak_over_idle_mb": round((peak[0] - idle_kb) / 1024), "idle_mb": round(idle_kb / 1024),
               "body_mb": round(len(body) / MB, 1), "message": message[:160]}
        if args.mode == "sizes" and not stopped:
            time.sleep(1.5)  # the store writes a moment after the answer
            row["trace_kb"] = round(stored_bytes(server.trace_db) / 1024, 1)
            row["prompt_tokens"] = answer.get("usage", {}).get("prompt_tokens") if status == 200 else message[:140]
        return row
    finally:
        server.stop()


def sizes(checkpoint: str, args: argparse.Namespace) -> list[dict]:
    rows = []
    for size in args.sizes_mb:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt(int(size * MB))}],
                           "max_tokens": 4}).encode()
        rows.append({"size_mb": size, **measured(checkpoint, "/v1/chat/completions", body, args)})
        r = rows[-1]
        print(f"{r['size_mb']:>7} MB  {r['status']}  {r['found']:<17} {r['seconds']:>6} s  "
              f"peak +{r['peak_over_idle_mb']:>5} MB  trace {r.get('trace_kb', '-'):>9} kB  {r.get('prompt_tokens')}",
              flush=True)
    return rows


def items(checkpoint: str, args: argparse.Namespace) -> list[dict]:
    import many_items

    rows = []
    for n in args.counts:
        for kind in args.kinds:
            path, body = many_items.body(kind, n, "m")
            rows.append({"kind": kind, "items": n, **measured(checkpoint, path, body, args)})
            r = rows[-1]
            print(f"{kind:<11} {n:>9,}  {r['body_mb']:>6} MB  {r['status']}  {r['found']:<22} {r['seconds']:>7} s  "
                  f"peak +{r['peak_over_idle_mb']:>5} MB  {r['message'][:90]}", flush=True)
    return rows


def images(checkpoint: str, args: argparse.Namespace) -> list[dict]:
    from PIL import Image

    from tiny_media import with_images

    side = 5792  # 33,548,264 pixels: under the default --media-max-pixels
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (200, 30, 30)).save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()

    def body(n: int) -> bytes:
        parts = [{"type": "image_url", "image_url": {"url": url}}] * n + [{"type": "text", "text": "What is it?"}]
        return json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": parts}]}).encode()

    folder = str(with_images(Path(checkpoint), "qwen3_5"))
    cases = [("one, past a context of 8,192", 1, ("--max-model-len", "8192")), ("four at once", 4, ()),
             ("one that fits", 1, ())]
    rows = []
    for name, n, extra in cases:
        rows.append({"images": name, **measured(folder, "/v1/chat/completions", body(n), args, *extra)})
        r = rows[-1]
        print(f"{name:<30} {r['status']}  {r['found']:<22} {r['seconds']:>7} s  peak +{r['peak_over_idle_mb']:>5} MB  "
              f"{r['message'][:90]}", flush=True)
    return rows


def main() -> None:
    import many_items

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=["sizes", "items", "images"], default="sizes")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[0.25, 0.5, 1, 2, 4, 10, 50, 200])
    parser.add_argument("--kinds", nargs="+", choices=many_items.KINDS, default=list(many_items.KINDS))
    parser.add_argument("--counts", type=int, nargs="+", default=[200_000, 2_000_000])
    parser.add_argument("--stop-mb", type=float, default=4096, help="stop a request past this much RSS over idle")
    parser.add_argument("--stop-s", type=float, default=240, help="stop a request that has not answered by then")
    args = parser.parse_args()
    import tiny_qwen3_5

    checkpoint = str(tiny_qwen3_5.qwen3_5_checkpoint())
    rows = {"sizes": sizes, "items": items, "images": images}[args.mode](checkpoint, args)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
