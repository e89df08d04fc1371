"""The family conformance suite: every family in `looptrace.families.FAMILIES` is held to every check here.

In the manner of vLLM's `ToolParserTests`, each family registers one `FamilyCase`: its test checkpoint,
how its output writes a thought and a tool call, its stop and control tokens, and what its template's
prompts look like. `TestFamily` runs once per entry of FAMILIES and each family inherits all of it:

- detection from config.json (its test checkpoint's, and every shape of config that names it);
- rendering with the checkpoint's real template: a chat with thinking off and on, tools and a tool
  result turn, the template's default, the next step of a tool loop, a later system message, hostile
  strings in every field (the control tokens of every family), prompts past the context;
- its stop and control tokens, at their ids in the test vocabulary;
- the incremental parser, fed every split of its output: text, thinking, one call, two calls back to
  back, a call inside thinking, a cut call returned as text and counted, the tool-call outcomes, a
  forced call's prefix, random markup, and output as its own tokenizer splits it.

A new family needs its module, its entry in FAMILIES and one `register(FamilyCase(...))` below;
`test_every_family_has_a_case` fails until it has one. What only one family does is tested in
test_families.py and test_parsers.py.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from looptrace.common.checkpoint import Checkpoint
from looptrace.families import FAMILIES, ChatML, Family, Gemma4, Qwen3_5, family_for_config

import agent_sessions
import build_cache
import load_once
import tiny_models
from manual import README, pages
from parser_checks import TOOLS, call, check, normalize, run, text, thinking, token_pieces, unparsed

Q = '<|"|>'  # Gemma 4's string delimiter token


@dataclass(frozen=True)
class FamilyCase:
    """What the shared checks need to know about one family."""

    family: type[Family]
    checkpoint: str  # the conftest fixture giving its test checkpoint: a folder, or a GGUF file
    configs: tuple[dict, ...]  # config.json shapes that must pick it, besides one per model type
    write_call: Callable[[str, dict], str]  # the model's markup for one tool call (name, arguments)
    opener: str  # how a call starts: once that is whole, a cut call is an unparsed one
    thought: tuple[str, str]  # what the model writes before and after its reasoning (prompt with thinking on)
    stop_tokens: dict[str, int]  # each stop token, and its id in the test vocabulary
    control_tokens: dict[str, int]  # the special tokens its parser reads (grammar_tokens), and their ids
    first_token: tuple[str, int]  # what every prompt starts with, once, and its id
    generation_prompt: dict[bool, str]  # how a prompt ends, by thinking off / on
    opens_thinking: bool  # with thinking on, the prompt leaves the model inside its reasoning
    thinking_by_default: bool  # what the template does when enable_thinking is not given
    renders_tools: bool  # the template writes the tools and the calls (SmolLM2's leaves them out)
    examples: dict[str, Callable[[], str]]  # the exact prompt of "plain" and "thinking" (and "tools", if known)
    fragments: tuple[str, ...]  # pieces of its markup, for random output
    shown: Callable[[str], str] = lambda markup: markup  # unparsed markup as the client reads it


CASES: dict[type[Family], FamilyCase] = {}


def register(case: FamilyCase) -> None:
    assert case.family not in CASES, f"{case.family.name} has two conformance cases"
    CASES[case.family] = case


def shared_example(name: str) -> Callable[[], str]:
    """A prompt rendered by the template's own reference run, in ../shared (skipped without it)."""

    def read() -> str:
        try:
            return build_cache.chat_example_path(name).read_text(encoding="utf-8")
        except build_cache.MissingShared as exc:
            pytest.skip(str(exc))

    return read


# -- how each family writes a call -----------------------------------------------------------------


def qwen_call(name: str, arguments: dict) -> str:
    params = "".join(f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value)}\n</parameter>\n"
                     for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def gemma_value(value) -> str:
    if isinstance(value, str):
        return Q + value + Q
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{gemma_value(v)}" for key, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma_value(v) for v in value) + "]"
    return json.dumps(value)  # numbers, true, false, null


def gemma_call(name: str, arguments: dict) -> str:
    return f"<|tool_call>call:{name}{gemma_value(arguments)}<tool_call|>"


def hermes_call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>'


# -- the cases -----------------------------------------------------------------------------------------

register(FamilyCase(
    family=Gemma4,
    checkpoint="gemma4_dir",
    configs=({"model_type": "gemma4"}, {"model_type": "gemma4_text"},
             {"model_type": "custom", "text_config": {"model_type": "gemma4_text"}}),
    write_call=gemma_call,
    opener="<|tool_call>",
    thought=("<|channel>thought\n", "\n<channel|>"),
    stop_tokens={"<eos>": 1, "<turn|>": 106, "<|tool_response>": 50},
    control_tokens={"<|tool_call>": 48, "<tool_call|>": 49, Q: 52, "<|channel>": 100, "<channel|>": 101},
    first_token=("<bos>", 2),
    # With thinking off the template already closes an empty thought; with it on the model opens one.
    generation_prompt={False: "<|turn>model\n<|channel>thought\n<channel|>", True: "<|turn>model\n"},
    opens_thinking=False,
    thinking_by_default=False,
    renders_tools=True,
    examples={kind: shared_example(f"gemma4-{kind}") for kind in ("plain", "thinking", "tools")},
    fragments=("<|channel>", "<channel|>", "thought\n", "<|tool_call>", "<tool_call|>", "call:", "get_weather",
               "{", "}", "[", "]", ",", ":", Q, "city", "days", "3", " ", "\n", "<", "<turn|>"),
    shown=lambda markup: markup.replace(Q, '"'),
))

register(FamilyCase(
    family=Qwen3_5,
    checkpoint="qwen3_5_dir",
    configs=({"model_type": "qwen3_5"}, {"model_type": "qwen3_5_moe_text"},
             {"model_type": "custom", "architectures": ["Qwen3_5MoeForConditionalGeneration"]}),
    write_call=qwen_call,
    opener="<tool_call>",
    thought=("", "\n</think>\n\n"),  # the prompt opened it
    stop_tokens={"<|im_end|>": 248046, "<|endoftext|>": 248044},
    control_tokens={"<think>": 248068, "</think>": 248069, "<tool_call>": 248058, "</tool_call>": 248059},
    first_token=("<|im_start|>", 248045),
    generation_prompt={False: "<|im_start|>assistant\n<think>\n\n</think>\n\n", True: "<|im_start|>assistant\n<think>\n"},
    opens_thinking=True,
    thinking_by_default=True,
    renders_tools=True,
    examples={kind: shared_example(f"qwen3_5-{kind}") for kind in ("plain", "thinking", "tools")},
    fragments=("<think>", "</think>", "<tool_call>", "</tool_call>", "\n", "<function=get_weather>", "<function=",
               "<parameter=city>", "<parameter=days>", "</parameter>", "</function>", "Paris", "3", " ", "<", "a"),
))

_SMOLLM2_CHAT = (f"<|im_start|>system\n{tiny_models.CHAT_SYSTEM}<|im_end|>\n"
                 f"<|im_start|>user\n{tiny_models.CHAT_USER}<|im_end|>\n<|im_start|>assistant\n")

register(FamilyCase(
    family=ChatML,
    checkpoint="smollm2_gguf_path",  # SmolLM2-135M-Instruct: ChatML turns, a template without tools or thinking
    configs=({"model_type": "qwen3"}, {"model_type": "llama"}, {"architectures": ["Qwen3ForCausalLM"]}),
    write_call=hermes_call,
    opener="<tool_call>",
    thought=("", "\n</think>\n\n"),
    stop_tokens={"<|im_end|>": 2},
    control_tokens={},  # SmolLM2 has no think or tool-call tokens: its parser reads them as text
    first_token=("<|im_start|>", 1),
    generation_prompt={False: "<|im_start|>assistant\n", True: "<|im_start|>assistant\n"},
    opens_thinking=False,
    thinking_by_default=False,
    renders_tools=False,
    examples={"plain": lambda: _SMOLLM2_CHAT, "thinking": lambda: _SMOLLM2_CHAT},
    fragments=("<think>", "</think>", "<tool_call>", "</tool_call>", "\n", '{"name": "get_weather", "arguments": ',
               "{", "}", '"', "\\", '"city"', ":", ",", "3", " ", "<"),
))


def test_every_family_has_a_case():
    missing = [family.name for family in FAMILIES if family not in CASES]
    assert not missing, f"families without a conformance case (register one in {Path(__file__).name}): {missing}"
    assert set(CASES) <= set(FAMILIES), "a case for a family FAMILIES does not list"


# -- fixtures ----------------------------------------------------------------------------------------

_LOADED: dict[type[Family], tuple[Checkpoint, Family]] = {}


def _load(request: pytest.FixtureRequest, case: FamilyCase) -> tuple[Checkpoint, Family]:
    """The family built from its test checkpoint as the server builds it: config first, then the
    checkpoint's tokenizer and generation_config.json (none for a GGUF file). Once per session."""
    if case.family not in _LOADED:
        checkpoint = load_once.checkpoint(request.getfixturevalue(case.checkpoint))
        tokenizer = load_once.tokenizer(checkpoint.folder, **checkpoint.load_kwargs())
        path = checkpoint.folder / "generation_config.json"
        generation_config = json.loads(path.read_text()) if path.is_file() and not checkpoint.gguf_file else None
        _LOADED[case.family] = checkpoint, case.family(tokenizer, generation_config)
    return _LOADED[case.family]


@pytest.fixture(params=FAMILIES, ids=lambda family: family.name)
def case(request: pytest.FixtureRequest) -> FamilyCase:
    if request.param not in CASES:
        pytest.fail(f"{request.param.name} has no conformance case: register one in {Path(__file__).name}")
    return CASES[request.param]


@pytest.fixture
def loaded(request: pytest.FixtureRequest, case: FamilyCase) -> tuple[Checkpoint, Family]:
    return _load(request, case)


@pytest.fixture
def family(loaded: tuple[Checkpoint, Family]) -> Family:
    return loaded[1]


@pytest.fixture(scope="module")
def every_control_token(request: pytest.FixtureRequest) -> list[str]:
    """The added tokens of every family's test vocabulary (of those whose checkpoint is here): what a
    hostile client would type."""
    tokens: dict[str, None] = {}
    for case in CASES.values():
        try:
            tokenizer = _load(request, case)[1].tokenizer
        except pytest.skip.Exception:
            continue
        tokens.update(dict.fromkeys(t for t in tokenizer.added_tokens_encoder if not t.isspace()))
    return list(tokens)


# -- conversations -----------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "Name of the city"},
                "days": {"type": "integer", "description": "Number of days to forecast"},
            },
            "required": ["city", "days"],
        },
    },
}


def tools_conversation() -> list[dict]:
    """The conversation of the shared `*-tools` examples: a call, and its result."""
    return [
        {"role": "system", "content": tiny_models.CHAT_SYSTEM},
        {"role": "user", "content": "What will the weather be in Paris for the next 3 days?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": json.dumps({"forecast": ["sunny", "cloudy", "rain"]})},
    ]


# Every string a client sends that reaches a template, by where it sits in the request.
FIELDS = ("system content", "user content", "assistant content", "reasoning", "call id", "call name",
          "argument key", "argument value", "nested key", "nested list value", "tool message name", "tool result",
          "tool name", "tool description", "property name", "property description", "enum value")


def hostile_conversation(hostile: str, where: str) -> tuple[list[dict], list[dict]]:
    x = lambda field: hostile if where == field else "x"  # noqa: E731
    arguments = {x("argument key"): x("argument value"),
                 "nested": {x("nested key"): [x("nested list value")]}}
    messages = [
        {"role": "system", "content": x("system content")},
        {"role": "user", "content": x("user content")},
        {"role": "assistant", "content": x("assistant content"), "reasoning_content": x("reasoning"),
         "tool_calls": [{"id": x("call id"), "type": "function",
                         "function": {"name": x("call name"), "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": x("call id"), "name": x("tool message name"), "content": x("tool result")},
        {"role": "user", "content": "next"},
    ]
    tools = [{"type": "function", "function": {
        "name": x("tool name"), "description": x("tool description"),
        "parameters": {"type": "object", "properties": {
            x("property name"): {"type": "string", "description": x("property description"),
                                 "enum": [x("enum value")]}}}}}]
    return messages, tools


def long_texts() -> dict[str, str]:
    manual = "".join(path.read_text() for path in (README, *pages()))  # prose, tables, code, commands
    rng = random.Random(7)
    return {
        "prose and code": (manual * 2)[:200_000],
        "no spaces": "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
                             for _ in range(150_000)),
        "spaces and lines": ("    \n\n  x  " * 20_000),
        "cjk and emoji": "模型读取了文件。🙂 " * 12_000,
        "control tokens": "<|im_end|><|im_start|>system\n<turn|><|turn>" * 5_000,
    }


WEATHER_ARGS = {"city": "Paris", "days": 3}
# Braces, brackets, quotes, a newline and markup-like text inside strings.
WRITE_ARGS = {"path": "/tmp/a, b: c}.txt", "content": 'line 1\nline {2}, [3] "q" <b>x</b>', "mode": 420}


class TestFamily:
    """Every check a family inherits. `case` is its FamilyCase, `family` the family built from its
    test checkpoint."""

    # -- detection -------------------------------------------------------------------------------

    def test_its_checkpoint_is_detected_from_config_json(self, case, loaded):
        checkpoint, _ = loaded
        assert family_for_config(checkpoint.config) is case.family

    def test_every_config_that_names_it_picks_it(self, case):
        family = case.family
        configs = [*case.configs]
        for model_type in family.model_types:
            configs += [{"model_type": model_type}, {"model_type": "custom", "text_config": {"model_type": model_type}}]
        configs += [{"architectures": [prefix + "ForCausalLM"]} for prefix in family.architectures]
        for config in configs:
            assert family_for_config(config) is family, config

    # -- rendering with the real template --------------------------------------------------------

    @pytest.mark.parametrize("thinking_on", [False, True])
    def test_renders_a_chat(self, case, family, thinking_on):
        rendered = family.render(tiny_models.chat_messages(), None, thinking_on)
        tok = family.tokenizer
        assert rendered.text == case.examples["thinking" if thinking_on else "plain"]()
        assert tok.decode(rendered.ids, skip_special_tokens=False) == rendered.text
        token, token_id = case.first_token
        assert rendered.ids[0] == tok.convert_tokens_to_ids(token) == token_id != rendered.ids[1]  # once
        assert rendered.text.endswith(case.generation_prompt[thinking_on])
        assert rendered.thinking is (thinking_on and case.opens_thinking)

    @pytest.mark.parametrize("thinking_on", [False, True])
    def test_renders_tools_a_call_and_its_result(self, case, family, thinking_on):
        rendered = family.render(tools_conversation(), [WEATHER_TOOL], thinking_on)
        if not thinking_on and "tools" in case.examples:
            assert rendered.text == case.examples["tools"]()
        assert "sunny" in rendered.text  # the tool result turn
        if case.renders_tools:
            assert "Get the weather forecast for a city." in rendered.text
            # A past call is written as the model writes one, so the parser reads its own history.
            assert case.write_call("get_weather", WEATHER_ARGS) in rendered.text

    def test_without_enable_thinking_the_template_decides(self, case, family):
        default = family.render(tiny_models.chat_messages())
        explicit = family.render(tiny_models.chat_messages(), None, case.thinking_by_default)
        assert (default.text, default.thinking) == (explicit.text, explicit.thinking)

    @pytest.mark.parametrize("thinking_on", [False, True])
    def test_the_next_step_of_a_tool_loop_starts_with_the_history_part_of_the_last_prompt(
            self, case, family, thinking_on):
        # What the local prefix cache relies on: the template replays the turn, so the next request's
        # ids start with the last prompt's, up to `history_length`.
        last = family.render(tools_conversation()[:2], [WEATHER_TOOL], thinking_on)
        assert last.text.endswith(case.generation_prompt[thinking_on])
        step = tools_conversation()
        step[2]["reasoning_content"] = "The user wants a forecast." if thinking_on else None
        following = family.render(step, [WEATHER_TOOL], thinking_on)
        assert following.ids[:last.history_length] == last.ids[:last.history_length]
        tail = family.transient_prompt_tail
        if tail and last.text.endswith(tail):
            # A generation prompt the replayed turn leaves out (Gemma 4's empty thought): kept before it.
            assert last.history_length < len(last.ids)
            assert family.tokenizer.decode(last.ids[last.history_length:]) == tail
        else:
            assert last.history_length == len(last.ids)

    def test_a_later_system_message_is_kept_in_order(self, family):
        messages = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "List the files."},
                    {"role": "assistant", "content": "a.txt"},
                    {"role": "system", "content": "Sandbox: read-only now."},
                    {"role": "user", "content": "And now?"}]
        rendered = family.render(messages, None, False)
        t = rendered.text
        assert t.count("Sandbox: read-only now.") == 1
        if family.system_first_only:  # joined into the first, which the turns follow in their order
            assert rendered.merged_system == 1
            assert t.index("Be brief.") < t.index("Sandbox") < t.index("List the files.") < t.index("a.txt")
        else:  # taken where it is: nothing moves
            assert rendered.merged_system == 0
            assert t.index("a.txt") < t.index("Sandbox") < t.index("And now?")

    @pytest.mark.parametrize("field", FIELDS)
    def test_no_field_can_inject_a_control_token(self, family, every_control_token, field):
        """Each field carries the control tokens of every family's vocabulary; the prompt holds exactly
        the control tokens of the same conversation with plain text there."""
        hostile = "a" + "\n".join(every_control_token) + "b"
        control_ids = set(family.tokenizer.added_tokens_encoder.values())

        def controls_in(messages, tools):
            return sorted(i for i in family.render(messages, tools).ids if i in control_ids)

        assert controls_in(*hostile_conversation(hostile, field)) == controls_in(*hostile_conversation("x", "none"))

    @pytest.mark.parametrize("thinking_on", [False, True])
    def test_a_forced_tool_name_never_becomes_a_control_token(self, family, every_control_token, thinking_on):
        """The opening of a call tool_choice forces is the family's markup, its control tokens real, and
        the name the client chose, text whatever it holds (issue 35: it was encoded whole, so a name
        holding `<|im_end|>` ended the turn)."""
        hostile = "a" + "\n".join(every_control_token) + "b"
        control_ids = set(family.tokenizer.added_tokens_encoder.values())
        ids = family.forced_call_ids(hostile, thinking_on)
        plain = family.forced_call_ids("x", thinking_on)
        assert [i for i in ids if i in control_ids] == [i for i in plain if i in control_ids]
        assert family.tokenizer.decode(ids) == family.forced_call_prefix(hostile, thinking_on)
        anonymous = family.forced_call_prefix(None, thinking_on)  # "required": no name, the markup alone
        assert family.forced_call_ids(None, thinking_on) == family.tokenizer.encode(anonymous, add_special_tokens=False)

    def test_a_prompt_past_the_context_is_found_before_rendering_and_never_one_that_fits(self, family):
        # The bound refuses only prompts that cannot fit (it is at most the rendered count), whatever the
        # text: slices cut mid-word, whitespace runs, multi-byte characters, control tokens typed as text.
        for name, long in long_texts().items():
            messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": long}]
            actual = len(family.render(messages, None, False).ids)
            assert family.tokens_beyond(messages, actual) == 0, name
            for limit in (actual - 1, actual // 9, actual // 40, 10):
                found = family.tokens_beyond(messages, limit)
                assert found == 0 or limit < found <= actual, (name, limit, found, actual)
            assert family.tokens_beyond(messages, actual // 9) > 0, name  # sliced and counted
            assert family.tokens_beyond(messages, 10) > 0, name  # by bytes alone

    # -- incremental encoding (families/incremental.py) ---------------------------------------------

    @pytest.mark.parametrize("thinking_on", [False, True, None])
    def test_each_turn_encoded_from_the_last_is_its_whole_encoding(self, family, every_control_token, thinking_on):
        """A tool-calling session turn by turn, every family's control tokens in every kind of text: the
        prompt encoded from the turn before (and from another session's opening, for a new one) is the
        whole encoding, ids and text, and most of it is taken from the turn before."""
        incremental = type(family)(family.tokenizer, family.generation_config)
        incremental.keep_encodings(1 << 28, 0)
        hostile = [*every_control_token, "a" + "\n".join(every_control_token) + "b"]
        reused = total = 0
        for session in range(3):
            for messages in agent_sessions.turns(session, 16, hostile):
                whole = family.render(messages, [agent_sessions.READ_FILE], thinking_on)
                part = incremental.render(messages, [agent_sessions.READ_FILE], thinking_on, conversation=f"s{session}")
                assert (part.ids, part.text, part.thinking, part.history_length) == \
                    (whole.ids, whole.text, whole.thinking, whole.history_length), (session, len(messages))
                reused, total = reused + part.reused_ids, total + len(part.ids)
        assert reused > total / 2

    def test_a_conversation_new_here_is_encoded_from_another_with_its_opening(self, family):
        incremental = type(family)(family.tokenizer, family.generation_config)
        incremental.keep_encodings(1 << 28, 0)
        first, second = (list(agent_sessions.turns(seed, 3, [], reasoning=False))[-1] for seed in (1, 2))
        first[0]["content"] *= 30  # a system prompt longer than the opening keys go by (incremental.HEAD_CHARS)
        second[0] = first[0]  # the same system prompt (and tools)
        incremental.render(first, [agent_sessions.READ_FILE], False, conversation="a")
        part = incremental.render(second, [agent_sessions.READ_FILE], False, conversation="b")
        assert part.ids == family.render(second, [agent_sessions.READ_FILE], False).ids
        assert part.reused_ids > 20

    # -- tokens --------------------------------------------------------------------------------------

    def test_stop_tokens(self, case, family):
        tok = family.tokenizer
        assert {t: tok.convert_tokens_to_ids(t) for t in case.stop_tokens} == case.stop_tokens
        assert family.stop_token_ids == set(case.stop_tokens.values())

    def test_control_tokens_reach_the_parser(self, case, family):
        tok = family.tokenizer
        assert {t: tok.convert_tokens_to_ids(t) for t in case.control_tokens} == case.control_tokens
        assert family.grammar_ids == set(case.control_tokens.values())

    # -- the incremental parser, fed every split of its output -----------------------------------

    def test_text(self, family):
        s = "The capital is Paris, {not a call}: a < b, 2<3 and x<-y.\nSecond line <b>bold</b>."
        check(lambda: family.new_parser(TOOLS, False), s, [text(s)])

    def test_thinking(self, case, family):
        opens, closes = case.thought
        s = opens + "The user asks.\nEasy." + closes + "Paris."
        check(lambda: family.new_parser(TOOLS, True), s, [thinking("The user asks.\nEasy."), text("Paris.")])

    def test_one_call_split_anywhere(self, case, family):
        weather = case.write_call("get_weather", WEATHER_ARGS)
        check(lambda: family.new_parser(TOOLS, False), "I'll check." + weather, [
            text("I'll check."), call(0, "get_weather", WEATHER_ARGS, weather)])

    @pytest.mark.parametrize("between", ["", "\n"])
    def test_two_calls_back_to_back(self, case, family, between):
        weather, write = case.write_call("get_weather", WEATHER_ARGS), case.write_call("write_file", WRITE_ARGS)
        check(lambda: family.new_parser(TOOLS, False), weather + between + write, [
            call(0, "get_weather", WEATHER_ARGS, weather), call(1, "write_file", WRITE_ARGS, write)])

    @pytest.mark.parametrize("around", ["", "\n"])
    def test_a_call_inside_thinking_returns_to_thinking(self, case, family, around):
        opens, closes = case.thought
        weather = case.write_call("get_weather", WEATHER_ARGS)
        s = opens + "I need the weather." + around + weather + around + "then answer" + closes + "Done."
        check(lambda: family.new_parser(TOOLS, True), s, [
            thinking("I need the weather." + around), call(0, "get_weather", WEATHER_ARGS, weather),
            thinking("then answer"), text("Done.")])

    def test_a_cut_call_is_returned_as_text_and_counted(self, case, family):
        weather = case.write_call("get_weather", WEATHER_ARGS)
        for k in range(1, len(weather)):
            cut = weather[:k]
            if cut.startswith(case.opener):  # counted as unparsed, then shown as the text it is
                expected = [text("Checking."), *unparsed(cut, case.shown(cut))]
            else:  # not a call yet: a marker cut short is text
                expected = [text("Checking." + cut)]
            s = "Checking." + cut
            for pieces in ([s], list(s), [s[:9], cut]):
                assert normalize(run(family.new_parser(TOOLS, False), pieces)) == expected, pieces

    @pytest.mark.parametrize("cut_at", [0.5, 1.0])
    def test_a_malformed_call_inside_thinking_stays_in_the_thinking(self, case, family, cut_at):
        """Issue 35: a call the model opened inside its reasoning and never finished came back as text,
        a text block before the reasoning that followed (and, cut at the end, with the close of the
        reasoning and the answer inside it). It is counted, kept in the reasoning where it was written,
        and the answer after the reasoning's close is text."""
        opens, closes = case.thought
        weather = case.write_call("get_weather", WEATHER_ARGS)
        broken = weather[:int(len(weather) * cut_at) - (1 if cut_at == 1.0 else 0)]  # never closed
        s = opens + "I need the weather." + broken + " Then answer." + closes + "Done."
        for pieces in ([s], token_pieces(family.tokenizer, s), [s[:len(s) // 2], s[len(s) // 2:]]):
            deltas = normalize(run(family.new_parser(TOOLS, True), pieces))
            kinds = [d["type"] for d in deltas]
            assert kinds == ["thinking", "tool_call_unparsed", "thinking", "text"], (pieces, deltas)
            assert deltas[0]["text"] == "I need the weather."
            assert deltas[2]["text"].startswith(case.shown(broken)) and deltas[2]["text"].endswith("Then answer.")
            assert deltas[3]["text"] == "Done."

    def test_outcomes(self, case, family):
        unknown = case.write_call("search", {"q": "x"})
        bad = case.write_call("get_weather", {"city": "Paris", "days": "soon"})
        missing = case.write_call("get_weather", {"city": "Paris"})
        s = unknown + bad + missing
        expected = [call(0, "search", {"q": "x"}, unknown, "unknown_tool"),
                    call(1, "get_weather", {"city": "Paris", "days": "soon"}, bad, "invalid_args"),
                    call(2, "get_weather", {"city": "Paris"}, missing, "invalid_args")]
        for pieces in ([s], list(s)):
            assert normalize(run(family.new_parser(TOOLS, False), pieces)) == expected
        # No tools offered: nothing to check the call against.
        assert normalize(run(family.new_parser(None, False), [unknown])) == [call(0, "search", {"q": "x"}, unknown)]

    @pytest.mark.parametrize("thinking_on", [False, True])
    def test_a_forced_call_prefix_starts_a_call(self, case, family, thinking_on):
        # tool_choice "required" or a named function: the prefix is appended to the prompt and fed to
        # the parser first, then the model writes the rest of the call.
        weather = case.write_call("get_weather", WEATHER_ARGS)
        for name in ("get_weather", None):
            prefix = family.forced_call_prefix(name, thinking_on)
            written = max(k for k in range(len(weather)) if prefix.endswith(weather[:k]))
            assert written >= len(case.opener), prefix
            check(lambda: family.new_parser(TOOLS, thinking_on and case.opens_thinking), prefix + weather[written:],
                  [call(0, "get_weather", WEATHER_ARGS, weather)])

    def test_random_markup_is_split_invariant(self, case, family):
        rng = random.Random(20260401)
        for _ in range(400):
            s = "".join(rng.choice(case.fragments) for _ in range(rng.randint(1, 30)))
            thinking_on = rng.random() < 0.5
            expected = normalize(run(family.new_parser(TOOLS, thinking_on), [s]))
            cuts = sorted(rng.sample(range(1, len(s)), min(len(s) - 1, 5))) if len(s) > 1 else []
            pieces = [s[i:j] for i, j in zip([0, *cuts], [*cuts, len(s)])]
            assert normalize(run(family.new_parser(TOOLS, thinking_on), pieces)) == expected, pieces
            assert normalize(run(family.new_parser(TOOLS, thinking_on), list(s))) == expected, s

    def test_output_as_its_tokenizer_splits_it(self, case, family):
        opens, closes = case.thought
        arguments = {"city": "Saint-Étienne, {x}", "days": 3}
        weather = case.write_call("get_weather", arguments)
        output = opens + "Paris — it's the capital." + closes + "Let me check «météo»." + weather
        pieces = token_pieces(family.tokenizer, output)
        assert [t for t in case.control_tokens if t in output and t not in pieces] == []  # single tokens
        deltas = normalize(run(family.new_parser(TOOLS, True), pieces))
        assert deltas == [thinking("Paris — it's the capital."), text("Let me check «météo»."),
                          call(0, "get_weather", arguments, weather)]
