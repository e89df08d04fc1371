"""The real harnesses — codex, Claude Code, opencode, pi — each through a rollout's base URL with token
continuity (issue 36): a multi-turn task with tool calls whose every prompt, as the engine read it, is
the previous prompt and the ids the model sampled, exactly, then the harness's new messages.

The application runs in this process (app_thread.py) so that a wrapper around its backend keeps what
the engine was handed (each DecodeRequest's prompt ids) and what it wrote: the test reads the engine,
not looptrace's record. The replay backend "writes" each step as token ids, and the ids are those a
model may sample but the tokenizer would not choose: one word of the tool call's argument one id per
character. The harness sends the call back as text (that is all it has), and rendered again it is
encoded otherwise: with `check` the turn is a REALIGN (the engine reads ids the model never sampled),
with `keep` the engine reads the sampled ids. So the 0 differences below are keep's doing, and the
pi run in `check` shows the same steps without it.

Every request of these runs is a turn of the main conversation: codex `exec`, `claude -p` (its
non-essential traffic off, as docs/clients.md sets it up), `opencode run --title` and pi make no request
of their own here. (opencode without `--title` asks the model for a title first, and Claude Code in
its interactive mode asks for one too: a separate conversation on the same rollout, not a
continuation; docs/rollouts.md says what that does.)
"""

from __future__ import annotations

import json

import pytest

import clients
from app_thread import AppThread, Reading
from messages_api import qwen_call

from looptrace.backends.recorded import ReplayBackend
from looptrace.common import attributes as attr
from looptrace.proxy.settings import Settings

API_KEY = "sk-looptrace-test"
MODEL = "tiny"
WORD = "looptrace"  # sampled one id per character in each tool call
QUOTE = '<|"|>'  # Gemma 4's string delimiter


def keeping(model, folder) -> AppThread:
    placeholder = folder / "none.jsonl"
    placeholder.write_text('{"text": "unused"}\n')
    return AppThread(Settings(model=str(model), backend="replay", replay=str(placeholder), served_model_name=MODEL,
                              trace_db=str(folder / "traces.sqlite3"), token_continuity="keep")).start()


@pytest.fixture(scope="module")
def qwen(qwen3_5_dir, tmp_path_factory):
    app = keeping(qwen3_5_dir, tmp_path_factory.mktemp("qwen-rollouts"))
    yield app
    app.stop()


@pytest.fixture(scope="module")
def gemma(gemma4_dir, tmp_path_factory):
    app = keeping(gemma4_dir, tmp_path_factory.mktemp("gemma-rollouts"))
    yield app
    app.stop()


def sampled(app: AppThread, text: str) -> list[int]:
    """`text`'s ids as a model may sample them: WORD (in it once) one id per character, where the
    tokenizer merges them. It decodes to the same text; encoding that text gives other ids."""
    tokenizer = app.runtime.vocab.tokenizer

    def encode(s: str) -> list[int]:
        return tokenizer.encode(s, add_special_tokens=False)

    before, after = text.split(WORD)
    letters = [encode(c) for c in WORD]
    assert all(len(ids) == 1 for ids in letters)
    ids = encode(before) + [i for (i,) in letters] + encode(after)
    assert tokenizer.decode(ids) == text and ids != encode(text)
    return ids


def replaying(app: AppThread, *steps: str) -> Reading:
    """The next requests get these steps, each sampled as `sampled` says (the last, the answer, as
    encoded); the backend read through the wrapper that keeps what the engine read and wrote."""
    ids = [sampled(app, s) for s in steps[:-1]] + [app.runtime.vocab.tokenizer.encode(steps[-1],
                                                                                       add_special_tokens=False)]
    backend = Reading(ReplayBackend([{"token_ids": i} for i in ids], app.runtime.vocab))
    app.runtime.backend = backend
    return backend


def differences(engine: Reading) -> list[int]:
    """For each request after the first: how many of the previous prompt's and sampled ids the
    engine's prompt does not hold in place (0: it starts with them, exactly)."""
    found = []
    for before, wrote, read in zip(engine.read, engine.wrote, engine.read[1:]):
        held = before + wrote
        found.append(sum(a != b for a, b in zip(read, held)) + max(0, len(held) - len(read)))
    return found


def classes(app: AppThread, rollout: str, steps: int) -> list[str | None]:
    """Each step's continuity class, from its render span."""
    def stored() -> dict:
        return app.stored(f"/v1/sessions/{rollout}")

    session = stored()
    for _ in range(100):
        if len(session["steps"]) >= steps:
            break
        session = stored()
    found = []
    for step in session["steps"]:
        trace = app.stored(f"/v1/traces/{step['trace_id']}")
        render = next(s for s in trace["spans"] if s["name"] == attr.SPAN_RENDER)["attributes"]
        found.append(render.get(attr.PROMPT_CONTINUITY))
    return found


def counted(app: AppThread, kind: str) -> float:
    return app.metric("looptrace_token_continuity_total", **{"class": kind, "model": MODEL})


def assert_kept(app: AppThread, engine: Reading, rollout: str, steps: int, kept_before: float) -> None:
    """Every request was a turn of the rollout's conversation, and each prompt the engine read is
    the previous prompt and the ids the model sampled, then the harness's new messages."""
    assert len(engine.read) == steps, engine.read
    assert differences(engine) == [0] * (steps - 1)
    assert all(len(read) > len(before) + len(wrote) for before, wrote, read
               in zip(engine.read, engine.wrote, engine.read[1:]))  # and something new: the tool's result
    assert classes(app, rollout, steps) == [None] + ["kept"] * (steps - 1)
    assert counted(app, "kept") - kept_before == steps - 1


def outcome(process) -> str:
    return f"exit {process.returncode}\nstdout:\n{process.stdout[-4000:]}\nstderr:\n{process.stderr[-4000:]}"


def folders(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return home, work


def rollout_url(app: AppThread, rollout: str) -> str:
    return f"{app.url}/r/{rollout}/v1"


ANSWER = "The command printed looptrace-ok twice."


def qwen_steps(tool: str, argument: str, **more: str) -> tuple[str, ...]:
    """Two calls of `tool` (its `argument` echoing WORD), then the answer, as Qwen3.5 writes them."""
    return ("I will run it.\n</think>\n\n" + qwen_call(tool, **{argument: "echo looptrace-ok"}, **more) + "<|im_end|>",
            "Once more.\n</think>\n\n" + qwen_call(tool, **{argument: "echo looptrace-ok"}, **more) + "<|im_end|>",
            "It worked.\n</think>\n\n" + ANSWER + "<|im_end|>")


def test_codex_through_a_rollout_reads_what_it_sampled(installed, qwen, tmp_path):
    before = counted(qwen, "kept")
    engine = replaying(qwen, *qwen_steps("exec_command", "cmd"))
    home, work = folders(tmp_path)
    clients.codex_home(home, rollout_url(qwen, "codex-1"), MODEL)
    done = clients.run_codex(installed, home, work, API_KEY, "Run echo looptrace-ok twice")
    assert done.returncode == 0, outcome(done)
    assert done.stdout.strip().endswith(ANSWER), outcome(done)
    assert_kept(qwen, engine, "codex-1", 3, before)


def test_claude_code_through_a_rollout_reads_what_it_sampled(installed, qwen, tmp_path):
    before = counted(qwen, "kept")
    engine = replaying(qwen, *qwen_steps("Bash", "command", description="Print a word"))
    home, work = folders(tmp_path)
    env = clients.claude_env(home, f"{qwen.url}/r/claude-1", API_KEY, MODEL)  # Anthropic's: no /v1
    done = clients.run_claude(installed, env, work, MODEL, "Run echo looptrace-ok twice", "--allowedTools", "Bash")
    assert done.returncode == 0, outcome(done)
    result = json.loads(done.stdout)
    assert (result["result"], result["num_turns"], result["is_error"]) == (ANSWER, 3, False), outcome(done)
    assert_kept(qwen, engine, "claude-1", 3, before)


def test_opencode_through_a_rollout_reads_what_it_sampled(installed, qwen, tmp_path):
    before = counted(qwen, "kept")
    engine = replaying(qwen, *qwen_steps("bash", "command"))
    home, work = folders(tmp_path)
    clients.opencode_home(home, installed, rollout_url(qwen, "opencode-1"), MODEL)
    done = clients.run_opencode(installed, home, work, API_KEY, "Run echo looptrace-ok twice")
    assert done.returncode == 0, outcome(done)
    events = clients.json_lines(done.stdout)
    assert [e["part"]["tool"] for e in events if e.get("type") == "tool_use"] == ["bash", "bash"]
    assert [e["part"]["text"] for e in events if e.get("type") == "text"][-1] == ANSWER
    assert_kept(qwen, engine, "opencode-1", 3, before)


def pi_steps(call: str, answer: str) -> tuple[str, ...]:
    return call, call, answer


def run_pi(installed, app: AppThread, rollout: str, tmp_path, headers: dict | None = None):
    home, work = folders(tmp_path)
    (work / "note.txt").write_text("pi-was-here\n")
    (work / "looptrace.txt").write_text("pi-was-here\n")
    agent = clients.pi_home(home, rollout_url(app, rollout), MODEL)
    if headers:  # pi's provider setting for headers of its own
        models = json.loads((agent / "models.json").read_text())
        models["providers"]["looptrace"]["headers"] = headers
        (agent / "models.json").write_text(json.dumps(models))
    done = clients.run_pi(installed, home, work, API_KEY, MODEL, "What does looptrace.txt say?")
    assert done.returncode == 0, outcome(done)
    (end,) = [e for e in clients.json_lines(done.stdout) if e.get("type") == "agent_end"]
    results = [m for m in end["messages"] if m["role"] == "toolResult"]
    assert [(r["toolName"], r["isError"]) for r in results] == [("read", False)] * 2, results
    return end


QWEN_READ = ("Read it.\n</think>\n\n" + qwen_call("read", path="looptrace.txt") + "<|im_end|>",
             "Got it.\n</think>\n\nIt says pi-was-here.<|im_end|>")


def test_pi_through_a_rollout_reads_what_it_sampled(installed, qwen, tmp_path):
    before = counted(qwen, "kept")
    engine = replaying(qwen, *pi_steps(*QWEN_READ))
    run_pi(installed, qwen, "pi-1", tmp_path)
    assert_kept(qwen, engine, "pi-1", 3, before)


def test_pi_checked_each_turn_is_a_realign_where_the_ids_were_not_kept(installed, qwen, tmp_path):
    """The same steps with `check` (pi's own header for it): the prompt rendered from pi's text holds
    the canonical ids where the model sampled others, and each turn is classified and counted."""
    realigned = counted(qwen, "realign")
    engine = replaying(qwen, *pi_steps(*QWEN_READ))
    run_pi(installed, qwen, "pi-checked", tmp_path, headers={"X-Token-Continuity": "check"})
    assert all(n > 0 for n in differences(engine)) and len(engine.read) == 3
    assert classes(qwen, "pi-checked", 3) == [None, "realign", "realign"]
    assert counted(qwen, "realign") - realigned == 2
    session = qwen.stored("/v1/sessions/pi-checked")
    trace = qwen.stored(f"/v1/traces/{session['steps'][1]['trace_id']}")
    render = next(s for s in trace["spans"] if s["name"] == attr.SPAN_RENDER)["attributes"]
    first = engine.read[0] + engine.wrote[0]
    where = next(i for i, (a, b) in enumerate(zip(engine.read[1], first)) if a != b)
    assert render[attr.PROMPT_CONTINUITY_DIFFERS_AT] == where  # in the call's argument, where WORD was split


def test_pi_through_a_rollout_reads_what_it_sampled_on_gemma4(installed, gemma, tmp_path):
    before = counted(gemma, "kept")
    call = f"<|tool_call>call:read{{path:{QUOTE}looptrace.txt{QUOTE}}}<tool_call|><|tool_response>"
    engine = replaying(gemma, *pi_steps(call, "It says pi-was-here.<turn|>"))
    run_pi(installed, gemma, "pi-gemma", tmp_path)
    assert_kept(gemma, engine, "pi-gemma", 3, before)

