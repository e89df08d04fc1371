"""/health while a 1,000-page PDF request is read: the PDF's text is read on the rendering thread, as
images are decoded, so the event loop goes on answering (issue 54: /health within 50 ms).

    python bench/pdf_health.py [--pages 1000] [--words 60] [--interval-ms 10]

`looptrace serve` on the replay backend (no model time) with the tiny Qwen3.5's real vocabulary and
template, keeping no encoding (`--render-cache-mb 0`: every prompt tokenized whole, none reused from
the one before). One `POST /v1/responses` attaches a PDF of PAGES pages, each of WORDS words of text
(pypdf reads every page: the costly case under the page limit); while it is answered, a second client
asks `GET /health` every INTERVAL ms, each on a new connection, as a load balancer's probe does. The
same probes run with nothing else running (the baseline), and while the PDF's own text is sent as text:
a prompt as long without a PDF, so what the PDF adds is told from what any prompt of that length costs.
The server first answers that text once, untimed: the first long prompt reads the vocabulary once
(families/prompt_length.py), which is not the PDF's.

It reports each set's p50, p95 and max latency, when the slowest probes were sent (seconds into the
request), the request's own time, and, for scale, how long reading the PDF's text takes in this
process alone: what the event loop, and every /health, would wait for were the PDF read there. A
thread reading a PDF holds the GIL only between switches (5 ms), so a probe is slowed by a few ms;
what stalls every thread at once is a full garbage collection (gen 2: ~0.4 s over a loaded server's
~380,000 objects), which any request that allocates enough can set off, on whichever thread. Prints
a table, then one JSON object. Measure on a quiet machine (/work/shared/tools/quiet-run).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

MODEL = "tiny-qwen"
GOAL_MS = 50.0
WORDS = ("the quarterly figures show revenue up four percent while costs held steady across every region "
         "with the largest gains in services and a small decline in hardware sales").split()


def text_pdf(pages: int, words: int) -> bytes:
    """A PDF of `pages` pages, each a few lines of Helvetica text, with a correct cross-reference table."""
    kids = b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(pages))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % pages,
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for page in range(pages):
        text = [f"Page {page + 1}:"] + [WORDS[(page + i) % len(WORDS)] for i in range(words)]
        lines = [" ".join(text[i:i + 12]) for i in range(0, len(text), 12)]
        shown = b" ".join(b"(%s) Tj 0 -14 Td" % line.encode("latin-1") for line in lines)
        stream = b"BT /F1 11 Tf 40 760 Td " + shown + b" ET"
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
                       b"/Resources << /Font << /F1 3 0 R >> >> >>" % (5 + 2 * page))
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def probe(port: int) -> float:
    """One GET /health on a new connection, in ms."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", "/health")
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"/health answered {response.status}")
    finally:
        connection.close()
    return (time.perf_counter() - started) * 1000


def probes_while(port: int, running: threading.Event | None, interval: float, count: int = 0) -> list[tuple]:
    """(latency ms, sent at s) of /health, one every `interval` s: while `running` is set, or `count` of them."""
    out: list[tuple] = []
    began = time.perf_counter()
    while (running.is_set() if running is not None else len(out) < count):
        sent = time.perf_counter() - began
        out.append((probe(port), sent))
        time.sleep(interval)
    return out


def during(server, body: dict, interval: float) -> tuple[list[tuple], dict]:
    """The probes while `body` is answered, and (status, answer, ms) of it."""
    running, answer = threading.Event(), {}

    def ask() -> None:
        begun = time.perf_counter()
        answer["status"], answer["body"] = server.request("POST", "/v1/responses", body, timeout=600)
        answer["ms"] = (time.perf_counter() - begun) * 1000
        running.clear()

    running.set()
    asking = threading.Thread(target=ask)
    asking.start()
    probes = probes_while(server.port, running, interval)
    asking.join()
    if answer["status"] != 200:
        raise SystemExit(f"the request failed: {answer['status']} {answer['body']}")
    return probes, answer


def figures(probes: list[tuple]) -> dict:
    ordered = sorted(ms for ms, _ in probes)
    slowest = sorted(probes, reverse=True)[:3]
    return {"probes": len(ordered), "p50_ms": round(statistics.median(ordered), 2),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 2),
            "max_ms": round(ordered[-1], 2), "slowest_at_s": [round(at, 2) for _, at in slowest]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--words", type=int, default=60, help="words of text on each page")
    parser.add_argument("--interval-ms", type=float, default=10.0)
    args = parser.parse_args()

    import tiny_qwen3_5
    from server import Server

    from looptrace.families.media.pdf import pdf_text

    pdf = text_pdf(args.pages, args.words)
    encoded = base64.b64encode(pdf).decode()
    started = time.perf_counter()
    text = pdf_text(encoded, "bench", "report.pdf")
    alone_ms = (time.perf_counter() - started) * 1000
    ask = {"type": "input_text", "text": "Summarise the report."}
    bodies = {"pdf": [ask, {"type": "input_file", "filename": "report.pdf",
                            "file_data": "data:application/pdf;base64," + encoded}],
              "text": [ask, {"type": "input_text", "text": text}]}
    bodies = {name: {"model": MODEL, "store": False, "input": [{"role": "user", "content": content}]}
              for name, content in bodies.items()}

    logs = Path(tempfile.mkdtemp(prefix="pdf-health-"))
    replay = logs / "replay.jsonl"
    replay.write_text((json.dumps({"text": "\n</think>\n\nSummarised.<|im_end|>"}) + "\n") * 8)
    server = Server(tiny_qwen3_5.qwen3_5_checkpoint(), "--backend", "replay", "--replay", str(replay),
                    "--served-model-name", MODEL, "--render-check-every", "0", "--render-cache-mb", "0",
                    log_dir=logs)  # no encoding kept: each prompt is tokenized whole, as a first one is
    interval = args.interval_ms / 1000
    try:
        server.wait_ready()
        server.request("POST", "/v1/responses", bodies["text"], timeout=600)  # the first long prompt's one-off cost
        idle = probes_while(server.port, None, interval, count=200)
        with_pdf, answer = during(server, bodies["pdf"], interval)
        with_text, as_text = during(server, bodies["text"], interval)
    finally:
        server.stop()
    result = {"args": vars(args), "pdf_bytes": len(pdf), "pdf_text_chars": len(text),
              "prompt_tokens": answer["body"].get("usage", {}).get("input_tokens"),
              "pdf_request_ms": round(answer["ms"], 1), "text_request_ms": round(as_text["ms"], 1),
              "pdf_text_alone_ms": round(alone_ms, 1), "health_idle": figures(idle),
              "health_during_pdf": figures(with_pdf), "health_during_same_text": figures(with_text)}
    result["goal_met"] = result["health_during_pdf"]["max_ms"] <= GOAL_MS
    print(f"PDF: {args.pages} pages, {len(pdf):,} bytes, {len(text):,} characters of text, "
          f"{result['prompt_tokens']} prompt tokens; read alone in {alone_ms:.0f} ms; "
          f"request {answer['ms']:.0f} ms (the same text as text: {as_text['ms']:.0f} ms)")
    print(f"{'/health':<24} {'probes':>7} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  slowest sent at (s)")
    for name, key in (("idle", "health_idle"), ("during the PDF", "health_during_pdf"),
                      ("during the same text", "health_during_same_text")):
        row = result[key]
        print(f"{name:<24} {row['probes']:>7} {row['p50_ms']:>8} {row['p95_ms']:>8} {row['max_ms']:>8}  "
              f"{row['slowest_at_s']}")
    print(f"goal: max ≤ {GOAL_MS:g} ms while the PDF is read: {'met' if result['goal_met'] else 'NOT met'}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
