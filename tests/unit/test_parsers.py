"""What each family's parser does that the others' do not, fed realistic output split at every point
(parser_checks.py): Qwen3.5's values typed by the schema and holding markup of their own, the model's
slips it recovers, Gemma 4's argument syntax and channels, Hermes' JSON, and each family's exact
forced-call prefix and unparsed markup.

What every family's parser must do (text, thinking, one call and two back to back, a call inside
thinking, a cut call as text, outcomes, random markup) is in test_family_conformance.py.
"""

from __future__ import annotations

import pytest

from looptrace.families.chatml import ChatML, HermesParser
from looptrace.families.gemma4 import Gemma4, GemmaParser
from looptrace.families.qwen3_5 import Qwen3_5, QwenParser

from parser_checks import TOOLS, call, check, text, thinking, unparsed


def bare(cls):
    """A family instance for its tokenizer-free methods (forced_call_prefix)."""
    return cls.__new__(cls)


# ---------------------------------------------------------------------------------------------
# Qwen3.5
# ---------------------------------------------------------------------------------------------


def qwen(thinking=False, tools=TOOLS):
    return lambda: QwenParser(tools, thinking)


def test_qwen_plain_text():
    s = "Hello <b>world</b>: a < b, 2<3 and x<-y.\nSecond line <thinking> is just text."
    check(qwen(), s, [text(s)])


def test_qwen_prompt_inside_think():
    s = "The user asks about Paris.\n\nIt is the capital.\n</think>\n\nParis is the capital of France."
    check(qwen(thinking=True), s, [
        thinking("The user asks about Paris.\n\nIt is the capital."),
        text("Paris is the capital of France."),
    ])


def test_qwen_model_opens_think_itself_before_content():
    check(qwen(), "\n<think>\nhmm, easy\n</think>\n\nAnswer: 4", [thinking("hmm, easy"), text("Answer: 4")])


def test_qwen_think_tag_after_content_is_text():
    check(qwen(), "Use a <think> tag.", [text("Use a <think> tag.")])


def test_qwen_repeated_think_tag_at_thinking_start_is_dropped():
    check(qwen(thinking=True), "<think>\nA <think> tag.\n</think>\n\nB", [thinking("A <think> tag."), text("B")])


def test_qwen_truncated_inside_thinking():
    check(qwen(thinking=True), "Still thinking about </thi", [thinking("Still thinking about </thi")])


WEATHER_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def test_qwen_several_calls_typed_values():
    write = ("<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n"
             "<parameter=content>\ndef f():\n    return '</parameter>'\n</parameter> not yet\n\n</parameter>\n"
             "<parameter=mode>\n420\n</parameter>\n<parameter=force>\ntrue\n</parameter>\n"
             "<parameter=ratio>\n2.50\n</parameter>\n<parameter=opts>\n{\"a\": [1, {\"b\": null}]}\n</parameter>\n"
             "<parameter=tags>\n[\"x\", \"y,}\"]\n</parameter>\n<parameter=note>\nnull\n</parameter>\n"
             "</function>\n</tool_call>")
    s = "I'll check.\n\n" + WEATHER_CALL + "\n" + write
    check(qwen(), s, [
        text("I'll check.\n\n"),
        call(0, "get_weather", {"city": "Paris", "days": 3}, WEATHER_CALL),
        call(1, "write_file", {
            "path": "/tmp/a.py",
            "content": "def f():\n    return '</parameter>'\n</parameter> not yet\n",
            "mode": 420, "force": True, "ratio": 2.5, "opts": {"a": [1, {"b": None}]},
            "tags": ["x", "y,}"], "note": None,
        }, write),
    ])


def test_qwen_bare_opener_then_text_streams_on():
    check(qwen(), "Write <tool_call> tags, then </tool_call>.", [
        text("Write "), *unparsed("<tool_call> ", then="tags, then </tool_call>."),
    ])


def test_qwen_garbage_decided_early():
    # JSON after the opener cannot become `<function=`: it streams on as text at once.
    parser = QwenParser(TOOLS, False)
    assert parser.feed("<tool_call>\n{") == [
        {"type": "tool_call_unparsed", "raw": "<tool_call>\n"}, text("<tool_call>\n"), text("{")]


def test_qwen_second_opener_restarts():
    s = "<tool_call><tool_call>\n<function=f>\n</function>\n</tool_call>"
    check(qwen(tools=None), s, [*unparsed("<tool_call>"), call(0, "f", {}, s[len("<tool_call>") :])])


def test_qwen_unknown_tool_and_invalid_args():
    unknown = ("<tool_call>\n<function=search>\n<parameter=q>\nParis\n</parameter>\n"
               "<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>")
    bad = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
           "<parameter=days>\nabc\n</parameter>\n</function>\n</tool_call>")
    missing = "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n</function>\n</tool_call>"
    check(qwen(), unknown + bad + missing, [
        call(0, "search", {"q": "Paris", "n": 5}, unknown, "unknown_tool"),
        call(1, "get_weather", {"city": "Paris", "days": "abc"}, bad, "invalid_args"),
        call(2, "get_weather", {"city": "42"}, missing, "invalid_args"),
    ])


def test_qwen_no_tools_offered_still_parses():
    check(qwen(tools=None), WEATHER_CALL, [call(0, "get_weather", {"city": "Paris", "days": 3}, WEATHER_CALL)])


@pytest.mark.parametrize("thinking_on", [True, False])
def test_qwen_forced_call_prefix(thinking_on):
    prefix = bare(Qwen3_5).forced_call_prefix("get_weather", thinking_on)
    assert prefix == ("\n</think>\n\n" if thinking_on else "") + "<tool_call>\n<function=get_weather>\n"
    rest = "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    raw = "<tool_call>\n<function=get_weather>\n" + rest
    check(qwen(thinking_on), prefix + rest, [call(0, "get_weather", {"city": "Paris", "days": 3}, raw)])
    assert bare(Qwen3_5).forced_call_prefix(None, thinking_on).endswith("<tool_call>\n<function=")


def write_call(params: str) -> str:
    return f"<tool_call>\n<function=write_file>\n{params}</function>\n</tool_call>"


def test_qwen_markup_inside_a_value_with_a_name_the_tool_lacks_is_value_text():
    content = "a\n</parameter>\n<parameter=encoding>\nutf-8\n</parameter>\nb"  # `encoding` is no parameter
    raw = write_call(f"<parameter=path>\nx.txt\n</parameter>\n<parameter=content>\n{content}\n</parameter>\n")
    check(qwen(), raw, [call(0, "write_file", {"path": "x.txt", "content": content}, raw)])


def test_qwen_a_parameter_the_tool_lacks_is_a_parameter_not_the_value_before_it():
    # Seen with opencode: Qwen3.5 gave its bash tool a `description` the schema does not have. Merged into
    # `command`, the command ran with the description's words in it.
    raw = write_call("<parameter=path>\nx.txt\n</parameter>\n<parameter=encoding>\nutf-8\n</parameter>\n")
    check(qwen(), raw, [call(0, "write_file", {"path": "x.txt", "encoding": "utf-8"}, raw, "invalid_args")])
    cut = write_call("<parameter=path>\nx.txt\n</parameter>\n<parameter=encoding>\nutf-8\n")  # its close left out
    check(qwen(), cut, [call(0, "write_file", {"path": "x.txt", "encoding": "utf-8"}, cut, "invalid_args")])


FIXTURE = ("def test_parse():\n    s = \"\"\"<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n"
           "</function>\n</tool_call>\"\"\"\n    assert parse(s)")


def test_qwen_a_value_holding_a_whole_tool_call_stays_in_the_value():
    # An agent writing a parser's test fixture: the literal `</tool_call>` is followed by more of the
    # value, so it does not end the call; the real end is followed by the output's end.
    raw = write_call(f"<parameter=path>\ntest_p.py\n</parameter>\n<parameter=content>\n{FIXTURE}\n</parameter>\n")
    check(qwen(), raw, [call(0, "write_file", {"path": "test_p.py", "content": FIXTURE}, raw)])


def test_qwen_a_value_holding_a_whole_tool_call_then_another_call():
    first = write_call(f"<parameter=path>\nt.py\n</parameter>\n<parameter=content>\n{FIXTURE}\n</parameter>\n")
    check(qwen(), first + "\n" + WEATHER_CALL, [
        call(0, "write_file", {"path": "t.py", "content": FIXTURE}, first),
        call(1, "get_weather", {"city": "Paris", "days": 3}, WEATHER_CALL),
    ])


# A file the agent writes that holds a whole call of this very tool (a parser's test fixture, a
# chat-template example): its names are the tool's own, so only nesting tells where the value ends.
NESTED_CALL = ('doc = """\n<tool_call>\n<function=write_file>\n<parameter=path>\nliteral/value.txt\n</parameter>\n'
               '<parameter=content>\nhello\n</parameter>\n</function>\n</tool_call>\n"""')


def test_qwen_a_value_holding_a_call_of_the_same_tool_stays_one_value():
    raw = write_call(f"<parameter=path>\nfixture.py\n</parameter>\n<parameter=content>\n{NESTED_CALL}\n</parameter>\n")
    check(qwen(), raw, [call(0, "write_file", {"path": "fixture.py", "content": NESTED_CALL}, raw)])
    # First, then followed by text or another call: the same.
    first = write_call(f"<parameter=content>\n{NESTED_CALL}\n</parameter>\n<parameter=path>\nf.py\n</parameter>\n")
    expected = call(0, "write_file", {"content": NESTED_CALL, "path": "f.py"}, first)
    check(qwen(), first + "\nDone.", [expected, text("Done.")])
    check(qwen(), first + "\n" + WEATHER_CALL, [expected, call(1, "get_weather", {"city": "Paris", "days": 3}, WEATHER_CALL)])


def test_qwen_a_value_holding_a_parameter_of_the_same_tool_stays_one_value():
    content = 'doc = """\n<parameter=path>\nliteral/value\n</parameter>\n"""'
    raw = write_call(f"<parameter=path>\nfixture.py\n</parameter>\n<parameter=content>\n{content}\n</parameter>\n")
    check(qwen(), raw, [call(0, "write_file", {"path": "fixture.py", "content": content}, raw)])


def test_qwen_a_call_of_another_tool_inside_a_value_after_that_call():
    first = "<tool_call>\n<function=foo>\n<parameter=bar>baz</parameter>\n</function>\n</tool_call>"
    content = f'template = """\n{first}\n"""'
    second = write_call(f"<parameter=path>\nfixture.py\n</parameter>\n<parameter=content>\n{content}\n</parameter>\n")
    check(qwen(), first + "\n\n" + second, [
        call(0, "foo", {"bar": "baz"}, first, "unknown_tool"),
        call(1, "write_file", {"path": "fixture.py", "content": content}, second),
    ])


def test_qwen_markup_a_value_opens_but_never_closes_is_text():
    # An opener written as text (in a string, in prose) leaves the nesting unbalanced: the value
    # still ends at its own `</parameter>`.
    for content in ('print("<tool_call>")', "use a <parameter=x> tag", 'f("<function=g>")'):
        raw = write_call(f"<parameter=content>\n{content}\n</parameter>\n<parameter=path>\nx\n</parameter>\n"
                         "<parameter=mode>\n1\n</parameter>\n")
        check(qwen(), raw, [call(0, "write_file", {"content": content, "path": "x", "mode": 1}, raw)])
    # Then a literal `</parameter>` in a later value does not end the first one there.
    raw = write_call("<parameter=content>\nprint(\"<tool_call>\")\n</parameter>\n"
                     "<parameter=path>\nreturn '</parameter>'\n</parameter>\n")
    check(qwen(), raw, [call(0, "write_file", {"content": 'print("<tool_call>")', "path": "return '</parameter>'"}, raw)])


def test_qwen_slips_around_markup_in_values_are_recovered():
    # The value holding a whole call has lost its own `</parameter>`: it ends at the call's end.
    raw = write_call(f"<parameter=path>\nf.py\n</parameter>\n<parameter=content>\n{NESTED_CALL}\n")
    check(qwen(), raw, [call(0, "write_file", {"path": "f.py", "content": NESTED_CALL}, raw)])
    # Values left open one after another, then text after the call.
    raw = write_call("<parameter=path>\na\n<parameter=content>\nb\n<parameter=mode>\n1\n</parameter>\n")
    check(qwen(), raw + "\nThat is all.", [
        call(0, "write_file", {"path": "a", "content": "b", "mode": 1}, raw), text("That is all.")])


def test_qwen_text_after_a_call_ends_it_where_the_output_ends():
    # `</tool_call>` and then text: nothing better comes, so the call ends there after all.
    check(qwen(), WEATHER_CALL + "\nAnd then some text.", [
        call(0, "get_weather", {"city": "Paris", "days": 3}, WEATHER_CALL), text("And then some text.")])


def test_qwen_null_for_a_nullable_parameter_is_json_null():
    raw = write_call("<parameter=path>\na\n</parameter>\n<parameter=content>\nb\n</parameter>\n"
                     "<parameter=label>\nnull\n</parameter>\n<parameter=mode>\nnull\n</parameter>\n")
    check(qwen(), raw, [call(0, "write_file", {"path": "a", "content": "b", "label": None, "mode": None}, raw)])


def test_qwen_a_last_value_without_its_close_is_recovered():
    raw = write_call("<parameter=path>\na.txt\n</parameter>\n<parameter=content>\nhello\n")
    check(qwen(), raw, [call(0, "write_file", {"path": "a.txt", "content": "hello"}, raw)])


def test_qwen_a_value_left_open_before_the_next_parameter_is_recovered():
    raw = write_call("<parameter=path>\na.txt\n<parameter=content>\nhello\n</parameter>\n")
    check(qwen(), raw, [call(0, "write_file", {"path": "a.txt", "content": "hello"}, raw)])


def test_qwen_stop_tokens_that_slip_through_are_dropped():
    check(qwen(), "Hi.<|im_end|>", [text("Hi.")])


# ---------------------------------------------------------------------------------------------
# Gemma 4
# ---------------------------------------------------------------------------------------------


def gemma(tools=TOOLS, thinking=False):
    return lambda: GemmaParser(tools, thinking)


Q = '<|"|>'
G_WEATHER = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3}}<tool_call|>"


def test_gemma_thinking_off_starts_in_content():
    check(gemma(), "The capital is Paris, {not a call}.", [text("The capital is Paris, {not a call}.")])


def test_gemma_thinking_on():
    s = "<|channel>thought\nThe user asks.\nEasy.\n<channel|>Paris."
    check(gemma(thinking=True), s, [thinking("The user asks.\nEasy."), text("Paris.")])


def test_gemma_other_channel_names_are_thinking():
    check(gemma(), "<|channel>analysis\nhm<channel|>ok", [thinking("hm"), text("ok")])


def test_gemma_calls_back_to_back_with_nested_values():
    write = (f"<|tool_call>call:write_file{{path:{Q}/tmp/a, b: c}}.txt{Q},content:{Q}line 1\nline {{2}}, [3]{Q},"
             f"mode:null,force:false,ratio:-1.5,opts:{{k:{Q}v{Q},n:{{deep:[1,{Q}x{Q},true]}}}},"
             f"tags:[{Q}a{Q},{Q}b,c{Q}]}}<tool_call|>")
    s = "Let me do both." + G_WEATHER + write
    check(gemma(), s, [
        text("Let me do both."),
        call(0, "get_weather", {"city": "Paris", "days": 3}, G_WEATHER),
        call(1, "write_file", {
            "path": "/tmp/a, b: c}.txt", "content": "line 1\nline {2}, [3]", "mode": None, "force": False,
            "ratio": -1.5, "opts": {"k": "v", "n": {"deep": [1, "x", True]}}, "tags": ["a", "b,c"],
        }, write),
    ])


def test_gemma_bare_opener_then_text():
    check(gemma(), "<|tool_call>Sorry, I can't.", unparsed("<|tool_call>", then="Sorry, I can't."))


def test_gemma_malformed_arguments_are_text():
    s = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q} days:3}}<tool_call|>After."
    check(gemma(), s, unparsed(s[:-6], '<|tool_call>call:get_weather{city:"Paris" days:3}<tool_call|>', "After."))


def test_gemma_quote_token_never_shown():
    check(gemma(), f"He said {Q}hi{Q}.", [text('He said "hi".')])


def test_gemma_unknown_tool_and_invalid_args():
    unknown = f"<|tool_call>call:search{{q:{Q}x{Q}}}<tool_call|>"
    bad = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:{Q}abc{Q}}}<tool_call|>"
    quoted = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:{Q}3{Q}}}<tool_call|>"
    check(gemma(), unknown + bad + quoted, [
        call(0, "search", {"q": "x"}, unknown, "unknown_tool"),
        call(1, "get_weather", {"city": "Paris", "days": "abc"}, bad, "invalid_args"),
        call(2, "get_weather", {"city": "Paris", "days": 3}, quoted),
    ])


@pytest.mark.parametrize("thinking_on", [True, False])
def test_gemma_forced_call_prefix(thinking_on):
    prefix = bare(Gemma4).forced_call_prefix("get_weather", thinking_on)
    assert prefix == ("<|channel>thought\n<channel|>" if thinking_on else "") + "<|tool_call>call:get_weather{"
    rest = f"city:{Q}Paris{Q},days:3}}<tool_call|>"
    check(gemma(thinking=thinking_on), prefix + rest, [call(0, "get_weather", {"city": "Paris", "days": 3}, G_WEATHER)])
    assert bare(Gemma4).forced_call_prefix(None, thinking_on).endswith("<|tool_call>call:")


def test_gemma_single_quoted_strings_in_arrays_and_objects():
    s = ("<|tool_call>call:write_file{path:'a.py',content:'x = [1, 2]}',"
         r"tags:['a.py', 'b,]}.py', 'it\'s', 'say \"hi\"'],opts:{k:'v:{w}',n:['C:\\dir']}}<tool_call|>")
    check(gemma(), s, [call(0, "write_file", {
        "path": "a.py", "content": "x = [1, 2]}", "tags": ["a.py", "b,]}.py", "it's", 'say "hi"'],
        "opts": {"k": "v:{w}", "n": ["C:\\dir"]}}, s)])


def test_gemma_apostrophe_inside_a_bare_word_is_text():
    s = "<|tool_call>call:get_weather{city:Xi'an,days:3}<tool_call|>"
    check(gemma(), s, [call(0, "get_weather", {"city": "Xi'an", "days": 3}, s)])


def test_gemma_single_quoted_string_left_open_is_text():
    s = "<|tool_call>call:get_weather{city:'Paris}<tool_call|>"
    check(gemma(), s, unparsed(s))


def test_gemma_stray_channel_close_is_kept_as_text():
    check(gemma(), "Done.<channel|> Really.", [text("Done.<channel|> Really.")])
    check(gemma(thinking=True), "<|channel>thought\nhm<channel|>ok<channel|>", [thinking("hm"), text("ok<channel|>")])


def test_gemma_stop_tokens_that_slip_through_are_dropped():
    check(gemma(), "Done.<turn|>" + G_WEATHER + "<|tool_response>", [
        text("Done."), call(0, "get_weather", {"city": "Paris", "days": 3}, G_WEATHER)])


# ---------------------------------------------------------------------------------------------
# ChatML / Hermes
# ---------------------------------------------------------------------------------------------


def hermes(tools=TOOLS, thinking=False):
    return lambda: HermesParser(tools, thinking)


H_WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris", "days": 3}}\n</tool_call>'


def test_hermes_plain_and_thinking():
    check(hermes(thinking=True), "Hmm {x}.\n</think>\n\nHi {there}.", [thinking("Hmm {x}."), text("Hi {there}.")])


def test_hermes_calls_with_braces_in_strings_and_string_arguments():
    as_string = ('<tool_call>\n{"name": "write_file", "arguments": "{\\"path\\": \\"a.txt\\", '
                 '\\"content\\": \\"}</tool_call>{\\\\\\"\\"}"}\n</tool_call>')
    alias = '<tool_call>\n{"name": "get_weather", "parameters": {"city": "Rome", "days": "2"}}\n</tool_call>'
    s = "Calling.\n" + H_WEATHER + "\n" + as_string + "\n" + alias + "\n"
    check(hermes(), s, [
        text("Calling.\n"),
        call(0, "get_weather", {"city": "Pa}ris", "days": 3}, H_WEATHER),
        call(1, "write_file", {"path": "a.txt", "content": '}</tool_call>{"'}, as_string),
        call(2, "get_weather", {"city": "Rome", "days": 2}, alias),
    ])


def test_hermes_json_that_does_not_parse_is_text():
    bad = '<tool_call>\n{"name": get_weather, "arguments": {}}\n</tool_call>'
    nameless = '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>'
    check(hermes(), bad + "x" + nameless, [*unparsed(bad, then="x"), *unparsed(nameless)])


def test_hermes_bare_opener_then_text():
    check(hermes(), "<tool_call> please", unparsed("<tool_call> ", then="please"))


def test_hermes_outcomes():
    unknown = '<tool_call>{"name": "search", "arguments": {"q": 1}}</tool_call>'
    bad = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": "soon"}}</tool_call>'
    check(hermes(), unknown + bad, [
        call(0, "search", {"q": 1}, unknown, "unknown_tool"),
        call(1, "get_weather", {"city": "Paris", "days": "soon"}, bad, "invalid_args"),
    ])
    check(hermes(tools=None), unknown, [call(0, "search", {"q": 1}, unknown)])


def test_hermes_forced_call_prefix():
    prefix = bare(ChatML).forced_call_prefix("get_weather", False)
    assert prefix == '<tool_call>\n{"name": "get_weather", "arguments": '
    rest = '{"city": "Paris", "days": 3}}\n</tool_call>'
    check(hermes(), prefix + rest, [call(0, "get_weather", {"city": "Paris", "days": 3}, prefix + rest)])
    # Fed into a parser that starts in thinking (the prompt ended in `<think>`), it is still a call.
    anonymous = bare(ChatML).forced_call_prefix(None, True)
    assert anonymous == '<tool_call>\n{"name": "'
    check(hermes(thinking=True), anonymous + 'get_weather", "arguments": ' + rest + "\n</think>\n\nok", [
        call(0, "get_weather", {"city": "Paris", "days": 3}, prefix + rest), text("ok")])


def test_gemma_channel_name_too_long_is_thinking():
    long = "x" * 70 + "\nrest"
    check(gemma(), "<|channel>" + long + "<channel|>ok", [thinking(long), text("ok")])
    check(gemma(), "<|channel>thou", [])
