"""The viewer draws a session's agents as a tree, in a real headless Chromium: Claude Code's header
shapes (main → a1 → a2) through the real app; each subagent under the step whose Task call spawned
it, the filter shows one agent's steps alone, and a hostile agent type stays text."""

from __future__ import annotations

import uuid

import pytest

from browser import Page
from .test_agent_tree import ANSWER, READS, SPAWN, Agent, claude_code, started_app

HOSTILE_TYPE = "<img src=x onerror=window.__pwned=1>"


@pytest.fixture(scope="module")
def app(qwen3_5_dir, tmp_path_factory):
    started = started_app(qwen3_5_dir, tmp_path_factory.mktemp("viewer-agents"))
    yield started
    started.stop()


@pytest.fixture
def page(browser):
    p = Page(browser)
    yield p
    assert p.errors == [], f"JavaScript errors in the page: {p.errors}"
    p.close()


def test_a_sessions_agents_are_a_tree_under_the_steps_that_spawned_them(app, page):
    session = "viewer-agents-" + uuid.uuid4().hex[:8]
    main, a1, a2 = claude_code(app, session, "check")
    a2.headers["x-claude-code-agent-type"] = HOSTILE_TYPE
    main.turn(SPAWN, then="The subagent said: in notes.txt")
    a1.turn(SPAWN, then="The sub-subagent said: notes.txt")
    a2.turn(READS, then="the word")
    a2.turn(ANSWER["qwen3_5"])
    a1.turn(ANSWER["qwen3_5"])
    main.turn(ANSWER["qwen3_5"])
    app.stored(f"/v1/sessions/{session}", steps=6)

    p = page.page
    p.goto(app.url + f"/sessions/{session}")
    p.locator("section.agents").wait_for()
    # a2 is drawn inside a1, a1 inside main's first step: the step whose Task call spawned it.
    assert p.locator('li.agent[data-agent="main"] > details > ol > li').nth(0) \
        .locator('li.agent[data-agent="a1"] li.agent[data-agent="a2"]').count() == 1
    summary = p.locator('li.agent[data-agent="a1"] > details > summary').inner_text()
    assert "Explore" in summary and "spawned by step 1" in summary
    assert HOSTILE_TYPE in p.locator('li.agent[data-agent="a2"] > details > summary').inner_text()
    assert p.evaluate("window.__pwned") is None and p.locator("section.agents img").count() == 0
    # The filter shows one agent's steps alone, in order.
    p.select_option("section.agents select", "a1")
    shown = p.locator("li.step:not([hidden])")
    assert shown.count() == 2 and p.locator("li.step[hidden]").count() == 4
    assert not p.locator("li.step[hidden]").first.is_visible()
    assert [shown.nth(i).get_attribute("data-agent") for i in range(2)] == ["a1", "a1"]
    # Steps stored while the page is open follow the filter: a1's shown, the main agent's not.
    p.locator("#live[data-state=on]").wait_for()
    a1.turn(ANSWER["qwen3_5"])
    p.locator("li.step").nth(6).wait_for(state="attached")
    main.turn(ANSWER["qwen3_5"])
    p.locator("li.step").nth(7).wait_for(state="attached")
    assert [p.locator("li.step").nth(i).get_attribute("data-agent") for i in (6, 7)] == ["a1", "main"]
    assert p.locator("li.step").nth(6).is_visible() and not p.locator("li.step").nth(7).is_visible()
    p.select_option("section.agents select", "")
    assert p.locator("li.step:not([hidden])").count() == 8
    # The sessions list says how many agents it had.
    p.goto(app.url + "/")
    row = p.locator("li", has_text=session).first
    row.wait_for()
    assert "8 steps · 3 agents" in row.inner_text()


def test_a_session_of_one_agent_draws_no_tree(app, page):
    session = "viewer-one-" + uuid.uuid4().hex[:8]
    Agent(app, {"X-Claude-Code-Session-Id": session}, "check", "Hello.").turn(ANSWER["qwen3_5"])
    app.stored(f"/v1/sessions/{session}", steps=1)
    p = page.page
    p.goto(app.url + f"/sessions/{session}")
    p.locator("li.step").first.wait_for()
    assert p.locator("section.agents").count() == 0
