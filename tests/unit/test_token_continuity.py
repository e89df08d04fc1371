"""`--token-continuity keep` never builds a wrong prompt (issue 41: H1 and L5), on each family's real
template (Qwen3.5, Gemma 4, ChatML as SmolLM2 writes it), under `keep` and `check`.

A turn is spliced (KEPT: the last prompt's ids + the ids the model sampled + the template's rendering of
what follows the answer) only when that is provably what the template would render now, the model's
own words in place of its rendering of them: the same tools, thinking setting and system text, the
answer's place found by rendering, and the assistant message the model's answer as parsed. Anything
else is a FORK (or a REALIGN, rendered as always). What the engine read is the backend's own record
(`Reading`); what a turn is rendered as always is the same request's prompt with continuity off."""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest

from looptrace.common import attributes as attr
from looptrace.proxy.settings import Settings

from .test_family_conformance import gemma_call, hermes_call, qwen_call
from app_thread import AppThread, Reading

CHECKPOINTS = {"gemma4": "gemma4_dir", "qwen3_5": "qwen3_5_dir", "chatml": "smollm2_gguf_path"}
READ = {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
GREP = {"type": "function", "function": {"name": "grep", "description": "Search files.", "parameters": {
    "type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}}}
WIPE = {"type": "function", "function": {"name": "delete_everything", "description": "Delete every file.",
                                         "parameters": {"type": "object", "properties": {}}}}
# What each model writes: a plain answer, and a call (the first two thinking where the prompt opened it).
SAID = "Hello there, friend."
ANSWER = {"qwen3_5": f"Let me think.\n</think>\n\n{SAID}<|im_end|>", "gemma4": f"{SAID}<turn|>",
          "chatml": f"{SAID}<|im_end|>"}


def call_output(family: str, name: str, arguments: dict) -> str:
    if family == "qwen3_5":
        return "I should read it.\n</think>\n\n" + qwen_call(name, arguments) + "<|im_end|>"
    if family == "gemma4":
        return gemma_call(name, arguments) + "<|tool_response>"
    return hermes_call(name, arguments) + "<|im_end|>"


@pytest.fixture(scope="module")
def apps(request, tmp_path_factory):
    """One application per family (the replay backend), started when first asked for."""
    started: dict[str, AppThread] = {}

    def get(family: str) -> AppThread:
        if family not in started:
            folder = tmp_path_factory.mktemp(family)
            placeholder = folder / "none.jsonl"
            placeholder.write_text('{"text": "unused"}\n')
            source = request.getfixturevalue(CHECKPOINTS[family])
            started[family] = AppThread(Settings(model=str(source), backend="replay", replay=str(placeholder),
                                                 served_model_name="tiny", trace_db=str(folder / "traces.sqlite3"),
                                                 token_continuity="off")).start()
        return started[family]

    yield get
    for app in started.values():
        app.stop()


@pytest.fixture(params=list(CHECKPOINTS))
def served(request, apps) -> tuple[str, AppThread]:
    return request.param, apps(request.param)


class Turn:
    """One request's answer (the message a client sends back), how its prompt continued the last turn
    (None: not classified), and the ids the engine read and the model sampled."""

    def __init__(self, message: dict, kind: str | None, read: list[int], wrote: list[int]) -> None:
        self.message, self.kind, self.read, self.wrote = message, kind, read, wrote


CLASSES = ("clean", "realign", "fork", "kept")


def classes_counted(app: AppThread) -> dict[str, float]:
    """looptrace_token_continuity_total by class, from one read of /metrics."""
    with urllib.request.urlopen(app.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    counts = dict.fromkeys(CLASSES, 0.0)
    for line in text.splitlines():
        if line.startswith("looptrace_token_continuity_total{"):
            series, _, value = line.rpartition(" ")
            counts[series.split('class="')[1].split('"')[0]] += float(value)
    return counts


def turn(app: AppThread, rollout: str, messages: list[dict], tools: list[dict] | None, output: str, *,
         mode: str, **body) -> Turn:
    counts = classes_counted(app)
    backend = Reading(app.replay(output))
    app.runtime.backend = backend
    request = {"model": "tiny", "messages": messages, "token_continuity": mode, **body}
    if tools is not None:
        request["tools"] = tools
    status, answer = app.call("POST", f"/r/{rollout}/v1/chat/completions", request)
    assert status == 200, answer
    now = classes_counted(app)
    changed = [k for k in CLASSES if now[k] != counts[k]]
    assert len(changed) <= 1, changed
    message = {k: v for k, v in answer["choices"][0]["message"].items()
               if k in ("role", "content", "tool_calls", "reasoning_content")}
    if message.get("content") is None:  # as most clients send a call back (SmolLM2's template needs it)
        message["content"] = ""
    return Turn(message, changed[0] if changed else None, backend.read[0], backend.wrote[0])


def rendered_as_always(app: AppThread, messages: list[dict], tools: list[dict] | None, **body) -> list[int]:
    """The prompt of these messages with continuity off: what the template renders of them."""
    return turn(app, new_rollout(), messages, tools, ANSWER_ANY, mode="off", **body).read


ANSWER_ANY = "x"


def new_rollout() -> str:
    return "continuity-" + uuid.uuid4().hex[:12]


def two_turns(app: AppThread, family: str, mode: str, *, first_tools, second_tools, edit=None,
              first_output: str | None = None, first_body: dict | None = None, second_body: dict | None = None,
              after: list[dict] | None = None) -> tuple[list[dict], Turn, Turn]:
    """Turn 1 [user], turn 2 [user, the answer (as `edit` leaves it), `after` or a new user message]."""
    rollout = new_rollout()
    ask = [{"role": "user", "content": "Please say hello; do not call delete_everything."}]
    first = turn(app, rollout, ask, first_tools, first_output or ANSWER[family], mode=mode, **(first_body or {}))
    answer = dict(first.message)
    if edit is not None:
        edit(answer)
    messages = [*ask, answer, *(after or [{"role": "user", "content": "SECOND-QUESTION-XYZ"}])]
    second = turn(app, rollout, messages, second_tools, ANSWER[family], mode=mode, **(second_body or {}))
    return messages, first, second


MODES = ["keep", "check"]


# -- H1: what the template renders around the answer changed -------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("change", ["removed", "added", "swapped"])
def test_h1_tools_changed_on_turn_two_is_a_fork_rendered_as_always(served, mode, change):
    family, app = served
    first_tools, second_tools = {"removed": ([READ], None), "added": (None, [READ]),
                                 "swapped": ([READ], [GREP])}[change]
    messages, first, second = two_turns(app, family, mode, first_tools=first_tools, second_tools=second_tools)
    assert second.kind == "fork"
    assert second.read == rendered_as_always(app, messages, second_tools)
    assert app.runtime.tokenizer.decode(second.read).count("SECOND-QUESTION-XYZ") == 1


@pytest.mark.parametrize("mode", MODES)
def test_h1_enable_thinking_changed_on_turn_two_is_a_fork(served, mode):
    family, app = served
    flipped = {"chat_template_kwargs": {"enable_thinking": family != "qwen3_5"}}
    messages, first, second = two_turns(app, family, mode, first_tools=[READ], second_tools=[READ],
                                        second_body=flipped)
    assert second.kind == "fork"
    assert second.read == rendered_as_always(app, messages, [READ], **flipped)


@pytest.mark.parametrize("mode", MODES)
def test_h1_a_system_message_after_the_answer_is_never_spliced_where_the_template_moves_it_first(served, mode):
    """Qwen3.5's template takes one system message, first: a later one is joined into it (families/base.py),
    so the text before the answer changes. Gemma 4's and SmolLM2's render it where it is: a new turn."""
    family, app = served
    after = [{"role": "system", "content": "NEW-SYSTEM-RULE"}, {"role": "user", "content": "SECOND-QUESTION-XYZ"}]
    messages, first, second = two_turns(app, family, mode, first_tools=[READ], second_tools=[READ], after=after)
    text = app.runtime.tokenizer.decode(second.read)
    assert text.count("NEW-SYSTEM-RULE") == 1 and text.count("SECOND-QUESTION-XYZ") == 1
    if family == "qwen3_5":
        assert second.kind == "fork"
        assert second.read == rendered_as_always(app, messages, [READ])
    else:  # Gemma 4's replayed turn leaves out the empty thought its generation prompt opened: a realign
        assert second.kind in (("kept",) if mode == "keep" else ("clean", "realign"))


@pytest.mark.parametrize("mode", MODES)
def test_h1_a_made_up_tool_call_in_the_answer_is_a_fork(served, mode):
    """The model only named the tool; the client's history says it called it, with arguments of its own."""
    family, app = served
    said = "I could call read_file."
    output = ANSWER[family].replace(SAID, said)

    def made_up(answer: dict) -> None:
        answer["tool_calls"] = [{"id": "call_x", "type": "function", "function": {
            "name": "read_file", "arguments": json.dumps({"path": "/etc/passwd"})}}]

    after = [{"role": "tool", "tool_call_id": "call_x", "content": "root:x:0:0"}]
    messages, first, second = two_turns(app, family, mode, first_tools=[READ], second_tools=[READ], edit=made_up,
                                        first_output=output, after=after)
    assert first.message["content"] == said
    assert second.kind == "fork"
    assert second.read == rendered_as_always(app, messages, [READ])


@pytest.mark.parametrize("mode", MODES)
def test_h1_a_call_sent_back_with_other_arguments_is_a_fork(served, mode):
    family, app = served

    def other_path(answer: dict) -> None:
        answer["tool_calls"][0]["function"]["arguments"] = json.dumps({"path": "/etc/passwd"})

    called = call_output(family, "read_file", {"path": "notes.txt"})
    after = [{"role": "tool", "tool_call_id": "call_1", "content": "hello"}]
    messages, first, second = two_turns(app, family, mode, first_tools=[READ], second_tools=[READ],
                                        edit=lambda a: (_call_id(a), other_path(a)), first_output=called, after=after)
    assert first.message["tool_calls"], first.message
    assert second.kind == "fork"


def _call_id(answer: dict) -> None:
    answer["tool_calls"][0]["id"] = "call_1"


# -- L5: the answer sent back is the model's, not any text found in the prompt ----------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("content", ["", "friend", "Hello there"], ids=["empty", "a-word", "a-prefix"])
def test_l5_an_empty_or_partial_answer_is_a_fork(served, mode, content):
    family, app = served

    def cut(answer: dict) -> None:
        answer["content"] = content
        answer.pop("reasoning_content", None)

    messages, first, second = two_turns(app, family, mode, first_tools=[READ], second_tools=[READ], edit=cut)
    assert second.kind == "fork"
    assert second.read == rendered_as_always(app, messages, [READ])


@pytest.mark.parametrize("mode", MODES)
def test_l5_a_tool_name_found_only_in_the_users_text_is_not_the_models_call(served, mode):
    family, app = served

    def wipe(answer: dict) -> None:
        answer["tool_calls"] = [{"id": "call_w", "type": "function", "function": {
            "name": "delete_everything", "arguments": "{}"}}]

    after = [{"role": "tool", "tool_call_id": "call_w", "content": "done"}]
    messages, first, second = two_turns(app, family, mode, first_tools=[READ, WIPE], second_tools=[READ, WIPE],
                                        edit=wipe, after=after)
    assert second.kind == "fork"


@pytest.mark.parametrize("mode", MODES)
def test_an_edited_earlier_message_stays_a_fork(served, mode):
    """As before the digests: a history whose earlier message changed does not continue the last turn."""
    family, app = served
    rollout = new_rollout()
    ask = [{"role": "user", "content": "Say hello."}]
    first = turn(app, rollout, ask, [READ], ANSWER[family], mode=mode)
    history = [*ask, first.message, {"role": "user", "content": "Again."}]
    second = turn(app, rollout, history, [READ], ANSWER[family], mode=mode)
    assert second.kind in (("kept",) if mode == "keep" else ("clean", "realign"))
    edited = [{"role": "user", "content": "Say goodbye."}, *history[1:], second.message,
              {"role": "user", "content": "thanks"}]
    third = turn(app, rollout, edited, [READ], ANSWER[family], mode=mode)
    assert third.kind == "fork"


# -- what is kept is a correct splice -------------------------------------------------------------------


def after_answer(app: AppThread, kept: Turn, previous: Turn) -> str:
    """The text the kept prompt holds after the last prompt and the ids the model sampled."""
    held = previous.read + previous.wrote
    assert kept.read[:len(held)] == held  # what the engine read: the model's own ids, as sampled
    return app.runtime.tokenizer.decode(kept.read[len(held):])


def test_an_answer_sent_back_as_the_model_wrote_it_is_kept_and_the_rest_is_the_templates(served):
    """Every turn of a tool loop kept: the prompt after the model's ids is exactly the text the template
    renders after the answer (what the rendering as always ends with, from the answer's turn-end marker),
    and it holds every new message once. Where the template keeps what it wrote (SmolLM2's: no reasoning
    to drop), the kept prompt's text is the rendering's, whole."""
    family, app = served
    tokenizer = app.runtime.tokenizer
    rollout = new_rollout()
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Read notes.txt"}]
    # SmolLM2's template writes nothing of a call-only answer but its empty turn: kept all the same.
    called = call_output(family, "read_file", {"path": "notes.txt"})
    outputs = [called, ANSWER[family], ANSWER[family]]
    previous = None
    for n, output in enumerate(outputs):
        now = turn(app, rollout, messages, [READ], output, mode="keep")
        if previous is None:
            assert now.kind is None
        else:
            assert now.kind == "kept", n
            rest = after_answer(app, now, previous)
            whole = tokenizer.decode(rendered_as_always(app, messages, [READ]))
            assert whole.endswith(rest) and rest.count(messages[-1]["content"]) == 1
            if family == "chatml":  # and the call its template drops is in the kept prompt, as written
                assert tokenizer.decode(now.read) == whole.replace("assistant\n<|im_end|>", "assistant\n" + called, 1)
        messages = messages + [now.message]
        if now.message.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": now.message["tool_calls"][0]["id"],
                             "content": "TOOL-SAID-HELLO"})
        else:
            messages.append({"role": "user", "content": f"NEXT-{n}"})
        previous = now


@pytest.mark.parametrize("mode", MODES)
def test_a_gemma_answer_whose_text_the_template_moves_past_the_tools_result_is_never_spliced(apps, mode):
    """Gemma 4 writes a past call's result inside the model's turn and the turn's text after it: the text
    the model wrote before its call lies after the result in the rendering, so no cut splits the answer
    from what follows. Rendered as always, and classified."""
    app = apps("gemma4")
    rollout = new_rollout()
    ask = [{"role": "user", "content": "Read notes.txt"}]
    first = turn(app, rollout, ask, [READ], "Reading it now." + call_output("gemma4", "read_file", {"path": "n"}),
                 mode=mode)
    assert first.message["content"] == "Reading it now." and first.message["tool_calls"]
    messages = [*ask, first.message, {"role": "tool", "tool_call_id": first.message["tool_calls"][0]["id"],
                                      "content": "TOOL-SAID-HELLO"}]
    second = turn(app, rollout, messages, [READ], ANSWER["gemma4"], mode=mode)
    assert second.kind in ("clean", "realign")
    assert second.read == rendered_as_always(app, messages, [READ])
    assert app.runtime.tokenizer.decode(second.read).count("Reading it now.") == 1


def test_h1_where_the_turns_before_the_answer_do_not_line_up_nothing_is_spliced(served):
    """The family's own check, whatever the engine compared first: the answer's place is found by
    rendering the conversation as it is asked now, and a kept prompt whose turns before the answer are
    not as many (the tools' system turn gone) is never spliced, even with the same messages; nor one
    where a later message is written before the answer."""
    from looptrace.families.continuity import continued  # here: main before issue 41 had no such function

    family, app = served
    first = turn(app, new_rollout(), [{"role": "user", "content": "hi"}], [READ], ANSWER[family], mode="keep")
    answer = {k: v for k, v in first.message.items() if k != "tool_calls"}
    messages = [{"role": "user", "content": "hi"}, answer, {"role": "user", "content": "SECOND-QUESTION-XYZ"}]
    served_family = app.runtime.family
    kept, spliced = continued(served_family, messages, 1, [READ], None, first.read, first.wrote,
                              conversation=None, encoding=0)
    assert spliced and kept.ids[:len(first.read) + len(first.wrote)] == first.read + first.wrote
    assert kept.text.count("SECOND-QUESTION-XYZ") == 1
    renders_tools = family != "chatml"  # SmolLM2's template writes no tools: nothing comes or goes
    whole, spliced = continued(served_family, messages, 1, None, None, first.read, first.wrote,
                               conversation=None, encoding=0)
    assert spliced is not renders_tools
    if renders_tools:
        assert whole.ids == served_family.render(messages).ids
    # A later system message the template moves before the answer (Qwen3.5's, joined into the first):
    # what the rendering ends with is not what the template writes after the answer alone.
    later_system = [*messages[:2], {"role": "system", "content": "NEW-SYSTEM-RULE"}, messages[2]]
    _, spliced = continued(served_family, later_system, 1, [READ], None, first.read, first.wrote,
                           conversation=None, encoding=0)
    assert spliced is (family != "qwen3_5")


def test_a_call_only_answer_is_placed_only_where_the_template_writes_its_empty_turn(apps, monkeypatch):
    """SmolLM2's template writes a call-only answer as an empty turn: the answer's place is proven by
    giving its empty text a mark, which must change nothing else. A template that writes no turn for
    an empty answer gives no such proof: nothing is spliced."""
    from looptrace.families.continuity import continued

    app = apps("chatml")
    ask = [{"role": "user", "content": "Read notes.txt"}]
    first = turn(app, new_rollout(), ask, [READ], call_output("chatml", "read_file", {"path": "notes.txt"}),
                 mode="keep")
    assert first.message["content"] == "" and first.message["tool_calls"]
    messages = [*ask, first.message, {"role": "tool", "tool_call_id": first.message["tool_calls"][0]["id"],
                                      "content": "TOOL-SAID-HELLO"}]
    family = app.runtime.family
    kept, spliced = continued(family, messages, 1, [READ], None, first.read, first.wrote, conversation=None,
                              encoding=0)
    assert spliced and kept.ids[:len(first.read) + len(first.wrote)] == first.read + first.wrote
    assert app.runtime.tokenizer.decode(kept.ids[len(first.read) + len(first.wrote):]).count("TOOL-SAID-HELLO") == 1
    skips_empty = ("{% for m in messages %}{% if m.role != 'assistant' or m.content %}<|im_start|>{{ m.role }}\n"
                   "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    monkeypatch.setattr(family.tokenizer, "chat_template", skips_empty)
    whole, spliced = continued(family, messages, 1, [READ], None, first.read, first.wrote, conversation=None,
                               encoding=0)
    assert not spliced and "<|im_start|>assistant\n<|im_end|>" not in whole.text


def test_a_fork_says_why_on_its_render_span_and_in_the_session(apps):
    app = apps("qwen3_5")
    rollout = new_rollout()
    ask = [{"role": "user", "content": "hi"}]
    first = turn(app, rollout, ask, [READ], ANSWER["qwen3_5"], mode="keep")
    turn(app, rollout, [*ask, first.message, {"role": "user", "content": "more"}], None, ANSWER["qwen3_5"],
         mode="keep")
    steps = app.stored(f"/v1/sessions/{rollout}", steps=2)["steps"]
    assert [(s.get("continuity"), s.get("continuity_fork")) for s in steps] == [(None, None), ("fork", "settings")]
    spans = app.stored(f"/v1/traces/{steps[1]['trace_id']}")["spans"]
    render = next(s for s in spans if s["name"] == attr.SPAN_RENDER)
    assert render["attributes"][attr.PROMPT_CONTINUITY_FORK] == "settings"


CALL_THEN_ANSWERS = (call_output("qwen3_5", "read_file", {"path": "notes.txt"}), ANSWER["qwen3_5"], ANSWER["qwen3_5"])


def kept_classes(app: AppThread, path: str, bodies) -> list[str | None]:
    """The class of each turn of a loop an API's client runs (`bodies`: given each answer, the next
    request's body, or None at the end), under `keep`."""
    backend = Reading(app.replay(*CALL_THEN_ANSWERS))
    app.runtime.backend = backend
    kinds, answer = [], None
    while (body := bodies(answer)) is not None:
        before = app.metric("looptrace_token_continuity_total", **{"class": "kept"})
        status, answer = app.call("POST", path, {"model": "tiny", "token_continuity": "keep", **body})
        assert status == 200, answer
        kinds.append("kept" if app.metric("looptrace_token_continuity_total", **{"class": "kept"}) > before else None)
    return kinds


def test_each_apis_client_sends_the_models_answer_back_as_the_models(apps):
    """A Responses client sends the output items back as input items, an Anthropic one the content
    blocks: each history reads as the model's own answer, and every turn is kept."""
    app = apps("qwen3_5")
    schema = READ["function"]["parameters"]
    items: list = [{"role": "user", "content": "Read notes.txt"}]

    def responses(answer):
        nonlocal items
        if answer is not None:
            calls = [o for o in answer["output"] if o["type"] == "function_call"]
            items = items + answer["output"] + ([{"type": "function_call_output", "call_id": calls[0]["call_id"],
                                                  "output": "hello"}] if calls else
                                                [{"role": "user", "content": "thanks"}])
        return None if sum(1 for i in items if i.get("role") == "user") > 2 else {
            "input": items, "tools": [{"type": "function", "name": "read_file", "parameters": schema}]}

    assert kept_classes(app, f"/r/{new_rollout()}/v1/responses", responses) == [None, "kept", "kept"]
    messages: list = [{"role": "user", "content": "Read notes.txt"}]

    def anthropic(answer):
        nonlocal messages
        if answer is not None:
            uses = [b for b in answer["content"] if b["type"] == "tool_use"]
            follow = [{"type": "tool_result", "tool_use_id": uses[0]["id"], "content": "hello"}] if uses else "thanks"
            messages = messages + [{"role": "assistant", "content": answer["content"]},
                                   {"role": "user", "content": follow}]
        return None if len(messages) > 5 else {"max_tokens": 64, "messages": messages,
                                               "tools": [{"name": "read_file", "input_schema": schema}]}

    assert kept_classes(app, f"/r/{new_rollout()}/v1/messages", anthropic) == [None, "kept", "kept"]
