"""The real codex (clients.CODEX: 0.171.0) in long sessions that compact, through looptrace, in each of its provider
settings (issue 42; docs/clients.md): the documented custom provider ("looptrace": codex compacts on its
own side), a custom provider named "OpenAI", and the built-in `openai` provider with `openai_base_url`
(both compact remotely: a `compaction_trigger` answered with one `compaction` item).

A 20-step `codex exec` session with a low `model_auto_compact_token_limit` compacts at least three
times; every command runs, codex exits 0, and the model's prompt after each compaction holds the
summary, as the trace store recorded it. codex's app-server compacts a thread on demand
(`thread/compact/start`) on both paths. The viewer marks the compaction steps.

The model is scripted (compacting_agent.py): it writes a summary when its prompt asks for one and the
next command otherwise, whenever codex decides to compact. The application runs in this process
(app_thread.py), with aiohttp's access log kept: the status of every request codex made.
"""

from __future__ import annotations

import logging
import re

import pytest

from looptrace.common import attributes as attr
from looptrace.proxy.api.openai.responses.compaction.plan import SUMMARY_HEADER
from looptrace.proxy.settings import Settings

import clients
from app_thread import AppThread
from codex_app_server import AppServer
from compacting_agent import CompactingAgent

API_KEY = "sk-looptrace-test"
MODEL = "tiny"
# codex's names for the provider: the documented custom one, one named as OpenAI's, and its built-in one.
PROVIDERS = {"custom": "looptrace", "named": "OpenAI", "builtin": None}
REMOTE = {"named", "builtin"}
# codex's first prompt here is about 8,600 tokens and each step adds about 100: past 9,100 tokens it
# compacts, every 5 or 6 steps, three times in 20 (measured with 0.169.0 on the tiny Qwen3.5).
LIMIT = 9100
COMMANDS = [f"echo step-{n}" for n in range(1, 21)]
ANSWER = "All twenty commands ran."


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def access():
    logger = logging.getLogger("looptrace.tests.access")
    handler = Kept()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield handler
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def app(qwen3_5_dir, tmp_path_factory, access):
    folder = tmp_path_factory.mktemp("codex-compaction")
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    started = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(placeholder),
                                 served_model_name=MODEL, trace_db=str(folder / "traces.sqlite3")),
                        access_log=logging.getLogger("looptrace.tests.access")).start()
    yield started
    started.stop()


def outcome(process) -> str:
    return f"exit {process.returncode}\nstdout:\n{process.stdout[-4000:]}\nstderr:\n{process.stderr[-6000:]}"


def statuses(lines: list[str]) -> list[tuple[str, int]]:
    """(request line, status) of each access-log line."""
    found = []
    for line in lines:
        match = re.search(r'"([A-Z]+ \S+) HTTP/[\d.]+" (\d{3}) ', line)
        if match:
            found.append((match.group(1), int(match.group(2))))
    return found


class Session:
    """One codex exec session, as codex told it (--json) and as the store recorded it."""

    def __init__(self, app: AppThread, agent: CompactingAgent, done, requests: list[tuple[str, int]],
                 compactions: float) -> None:
        self.app, self.agent, self.done, self.requests, self.compactions = app, agent, done, requests, compactions
        self.events = clients.json_lines(done.stdout)
        started = [e for e in self.events if e.get("type") == "thread.started"]
        self.thread = started[0]["thread_id"] if started else None

    def steps(self) -> list[dict]:
        # Every request of the run: the 20 commands' and the answer's, and one per compaction.
        count = len(COMMANDS) + 1 + len(self.agent.summaries)
        return self.app.stored(f"/v1/sessions/{self.thread}", timeout=30, steps=count)["steps"]

    def prompt(self, step: dict) -> str:
        return self.app.stored(f"/v1/traces/{step['trace_id']}/prompt")["text"]


@pytest.fixture(scope="module")
def sessions(app, access, installed, tmp_path_factory):
    """Each provider setting's session, run once (the viewer's test reads one of them again)."""
    made: dict[str, Session] = {}

    def run(setting: str) -> Session:
        if setting not in made:
            agent = CompactingAgent(app.runtime.vocab, COMMANDS, ANSWER)
            app.runtime.backend = agent
            home, work = (tmp_path_factory.mktemp(f"{setting}-{part}") for part in ("home", "work"))
            clients.codex_home(home, app.url + "/v1", MODEL, name=PROVIDERS[setting],
                               settings={"model_auto_compact_token_limit": LIMIT})
            mark, before = len(access.lines), app.metric("looptrace_compactions_total", how="trigger")
            done = clients.run_codex(installed, home, work, API_KEY, "Run the twenty steps", "--json", timeout=600)
            made[setting] = Session(app, agent, done, statuses(access.lines[mark:]),
                                    app.metric("looptrace_compactions_total", how="trigger") - before)
        return made[setting]

    return run


@pytest.mark.parametrize("setting", list(PROVIDERS))
def test_a_20_step_codex_session_compacts_and_runs_every_command(sessions, setting):
    session = sessions(setting)
    assert session.done.returncode == 0, outcome(session.done)
    commands = [e["item"] for e in session.events
                if e.get("type") == "item.completed" and e["item"]["type"] == "command_execution"]
    assert [(c["exit_code"], c["aggregated_output"].strip()) for c in commands] == \
        [(0, f"step-{n}") for n in range(1, 21)], outcome(session.done)
    messages = [e["item"]["text"] for e in session.events
                if e.get("type") == "item.completed" and e["item"]["type"] == "agent_message"]
    assert messages[-1] == ANSWER
    summaries = session.agent.summaries
    assert len(summaries) >= 3, outcome(session.done)
    # Remote settings compact through looptrace, one counted compaction each; the custom one on codex's side.
    assert session.compactions == (len(summaries) if setting in REMOTE else 0)

    # The model's prompt after each compaction holds its summary, as the trace store recorded it.
    steps = session.steps()
    for summary in summaries:
        at = next(i for i, step in enumerate(steps) if summary in _output(step))
        # Each compaction is a step marked as one: looptrace's (remote), or codex's own, as it says.
        assert steps[at]["compaction"]["how"] == ("trigger" if setting in REMOTE else "client")
        assert steps[at]["compaction"]["replaced_items"] > 0
        if setting in REMOTE:
            assert steps[at + 1]["compactions_expanded"] == 1
        after = session.prompt(steps[at + 1])
        assert summary in after, f"step {at + 2} of {len(steps)} lacks {summary!r}"
        if setting in REMOTE:
            assert SUMMARY_HEADER + summary in after

    # No request codex made was refused for its method (the built-in provider first tries the
    # Responses WebSocket mode: GET /v1/responses).
    refused = [line for line, status in session.requests if status == 405]
    assert not refused, refused
    assert all(status < 400 for _, status in session.requests), session.requests


def _output(step: dict) -> str:
    return "".join(part.get("content", "") for message in step.get("output") or ()
                   for part in message.get("parts", ()) if part.get("type") == "text")


@pytest.mark.parametrize("setting", ["custom", "named"])
def test_the_app_server_compacts_a_thread_on_demand(app, installed, tmp_path, setting):
    agent = CompactingAgent(app.runtime.vocab, ["echo first"], ANSWER)
    app.runtime.backend = agent
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    clients.codex_home(home, app.url + "/v1", MODEL, name=PROVIDERS[setting])
    before = app.metric("looptrace_compactions_total", how="trigger")
    server = AppServer(installed, home, API_KEY)
    try:
        thread = server.start(work)
        assert server.turn(thread, "Run the first command")["params"]["turn"]["status"] == "completed"
        compacted = server.compact(thread)
        assert compacted["params"]["turn"]["status"] == "completed", compacted
        assert server.turn(thread, "Go on")["params"]["turn"]["status"] == "completed"
    finally:
        server.close()
    (summary,) = agent.summaries
    assert app.metric("looptrace_compactions_total", how="trigger") - before == (1 if setting in REMOTE else 0)
    steps = app.stored(f"/v1/sessions/{thread}", timeout=30, steps=4)["steps"]
    # The command, the answer, the compaction, then the next turn: its prompt holds the summary.
    assert summary in _output(steps[2]) and summary in app.stored(f"/v1/traces/{steps[3]['trace_id']}/prompt")["text"]


# -- the manual's snippets ----------------------------------------------------------------------------

def codex_snippets() -> list[tuple[str, str]]:
    """(page, TOML) of every codex configuration the manual shows, as a reader copies it."""
    from manual import page

    found = []
    for name in ("clients.md", "rollouts.md"):
        for block in re.findall(r"```toml\n(.*?)```", page(name), re.S):
            text = "\n".join(line.strip() for line in block.splitlines())  # a list item's block is indented
            if "model_providers" in text or "openai_base_url" in text:
                found.append((name, text))
    return found


def test_every_codex_configuration_in_the_manual_runs_as_copied(app, installed, tmp_path):
    # docs/rollouts.md's once lacked the provider's name, and codex refused it ("provider name must not be empty").
    # clients.md's WebSocket snippet once showed the provider's table alone: copied as it stood, codex took its
    # built-in `openai` provider and dialled api.openai.com ("failed to connect to Responses WebSocket", then
    # "failed to lookup address information"), never looptrace.
    snippets = codex_snippets()
    assert len(snippets) == 5, snippets  # clients.md: three provider settings and the WebSocket one; rollouts.md: its URL
    assert sum("supports_websockets = true" in text for _, text in snippets) == 1, snippets
    for n, (name, text) in enumerate(snippets):
        app.runtime.backend = CompactingAgent(app.runtime.vocab, [], ANSWER)
        home, work = tmp_path / f"home-{n}", tmp_path / f"work-{n}"
        (home / ".codex").mkdir(parents=True)
        work.mkdir()
        config = text.replace("http://127.0.0.1:8000", app.url).replace("Qwen/Qwen3.5-0.8B", MODEL)
        (home / ".codex" / "config.toml").write_text(config)
        before = {endpoint: app.metric("looptrace_requests_total", endpoint=endpoint)
                  for endpoint in (attr.ENDPOINT_RESPONSES, attr.ENDPOINT_RESPONSES_WEBSOCKET)}
        done = clients.run_codex(installed, home, work, API_KEY, "Say done")
        assert done.returncode == 0 and done.stdout.strip().endswith(ANSWER), f"{name}:\n{config}\n{outcome(done)}"
        app.settled()
        added = {endpoint: app.metric("looptrace_requests_total", endpoint=endpoint) - count
                 for endpoint, count in before.items()}
        # The turn reached looptrace (not OpenAI), and over the socket where the snippet asks for it.
        if "supports_websockets = true" in text:
            assert added == {attr.ENDPOINT_RESPONSES: 0, attr.ENDPOINT_RESPONSES_WEBSOCKET: 1}, \
                f"{name}: {added}\n{config}\n{outcome(done)}"
            assert "falling back" not in done.stderr.lower(), outcome(done)
        else:
            assert sum(added.values()) >= 1, f"{name}: {added}\n{config}\n{outcome(done)}"


# -- the viewer ---------------------------------------------------------------------------------------

def test_the_viewer_marks_the_compaction_steps(sessions, browser):
    from browser import Page

    session = sessions("named")
    compactions = [i for i, step in enumerate(session.steps()) if step.get("compaction")]
    assert len(compactions) >= 3
    page = Page(browser)
    try:
        p = page.page
        p.goto(f"{session.app.url}/sessions/{session.thread}")
        steps = p.locator("li.step")
        steps.first.wait_for()
        marked = [i for i in range(steps.count()) if steps.nth(i).locator(".badge.compaction:not(.expanded)").count()]
        assert marked == compactions
        badge = steps.nth(compactions[0]).locator(".badge.compaction")
        assert badge.inner_text() == "compaction" and "replaces the" in badge.get_attribute("title")
        after = steps.nth(compactions[0] + 1).locator(".badge.compaction.expanded")
        assert after.inner_text() == "from summary"
        assert page.errors == [], page.errors
    finally:
        page.close()
