"""A conversation's template text rendered from what each turn adds (families/render_windows.py) is
the whole rendering's, token for token, on each family's real template (Qwen3.5, Gemma 4, ChatML as
SmolLM2 writes it): through a long tool-calling session, a new user message after reasoning (which
Qwen3.5's template answers by rewriting earlier turns), and a kept state that no longer matches."""

from __future__ import annotations

import pytest

from looptrace.families.render_windows import FALLBACK, WHOLE, WINDOW

from .test_family_conformance import CASES, _load

READ = {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


@pytest.fixture(params=list(CASES), ids=lambda family: family.name)
def family(request):
    """The family as the server builds it, rendering from windows and never sampling a whole check (so
    that every comparison here is the test's own); encodings and windows dropped afterwards."""
    _, family = _load(request, CASES[request.param])
    family.keep_encodings(64 * 1024**2, 0)
    yield family
    family.keep_encodings(0, 0)


def tool_turn(n: int) -> list[dict]:
    call = {"id": f"call_{n}", "type": "function",
            "function": {"name": "read_file", "arguments": {"path": f"src/file_{n}.py"}}}
    return [{"role": "assistant", "content": "", "reasoning_content": f"I should read file {n}.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": f"def f{n}():\n    return {n}\n" * 3}]


def session() -> list[list[dict]]:
    """The conversation at each turn: a task, twelve tool calls, a new user message after the model's
    answer (with reasoning), then twelve more."""
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Read every file."}]
    turns = [list(messages)]
    for n in range(12):
        messages += tool_turn(n)
        turns.append(list(messages))
    messages += [{"role": "assistant", "content": "Done reading.", "reasoning_content": "All read."},
                 {"role": "user", "content": "Now the tests, please."}]
    turns.append(list(messages))
    for n in range(12, 24):
        messages += tool_turn(n)
        turns.append(list(messages))
    return turns


def whole_ids(family, messages: list[dict]) -> list[int]:
    return family.encoder.encode_marked(family.marked_chat(messages, [READ], {"enable_thinking": True}))


def test_each_turn_rendered_from_a_window_is_the_whole_rendering_token_for_token(family):
    hows = []
    for messages in session():
        rendered = family.render(messages, [READ], enable_thinking=True, conversation="c1")
        assert rendered.ids == whole_ids(family, messages), (len(messages), rendered.rendered_how)
        hows.append(rendered.rendered_how)
    assert hows[0] == WHOLE
    assert hows.count(WINDOW) >= 20, hows  # all but the first few turns and the new user message's
    assert hows[13] == FALLBACK  # a new user message: rendered whole, whether or not the template rewrites
    assert family.windows.drift == 0


def test_a_corrupted_kept_text_is_caught_by_the_certificate_and_rendered_whole(family):
    turns = session()
    for messages in turns[:6]:
        family.render(messages, [READ], enable_thinking=True, conversation="c2")
    kept = family.windows._kept["c2"]
    at = len(kept.text) - 30  # where the window overlaps it
    kept.text = kept.text[:at] + ("#" if kept.text[at] != "#" else "%") + kept.text[at + 1:]
    rendered = family.render(turns[6], [READ], enable_thinking=True, conversation="c2")
    assert rendered.rendered_how == FALLBACK
    assert rendered.ids == whole_ids(family, turns[6])


def test_kept_messages_that_differ_from_the_request_are_rendered_whole(family):
    turns = session()
    for messages in turns[:6]:
        family.render(messages, [READ], enable_thinking=True, conversation="c3")
    edited = [dict(m) for m in turns[6]]
    edited[3] = {**edited[3], "content": "an earlier result, edited by the client"}
    rendered = family.render(edited, [READ], enable_thinking=True, conversation="c3")
    assert rendered.rendered_how == FALLBACK
    assert rendered.ids == whole_ids(family, edited)


def test_a_sampled_whole_rendering_that_differs_is_counted_as_drift_and_used(family):
    family.keep_encodings(64 * 1024**2, 1)  # every window checked
    turns = session()
    for messages in turns[:5]:
        family.render(messages, [READ], enable_thinking=True, conversation="c4")
    kept = family.windows._kept["c4"]
    kept.text = "X" + kept.text  # before the window: only a whole rendering sees it
    rendered = family.render(turns[5], [READ], enable_thinking=True, conversation="c4")
    assert (rendered.rendered_how, rendered.render_checked) == (FALLBACK, False)
    assert rendered.ids == whole_ids(family, turns[5])
    assert family.windows.drift == 1
    rendered = family.render(turns[6], [READ], enable_thinking=True, conversation="c4")
    assert (rendered.rendered_how, rendered.render_checked) == (WINDOW, True)
