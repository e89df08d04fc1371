"""common/jsonio.py: orjson where it reads and writes JSON as json does, json where it does not."""

from __future__ import annotations

import json

import pytest

from looptrace.common.jsonio import dumps, loads

LONG = [2**64, -(2**63) - 1, 10**30, -(10**40)]


@pytest.mark.parametrize("number", LONG, ids=str)
@pytest.mark.parametrize("kind", [str, bytes], ids=["str", "bytes"])
def test_an_integer_past_64_bits_reads_back_whole_not_as_a_float(number, kind):
    """orjson reads these as floats, silently; a tool call's arguments or a client's field would come back
    rounded."""
    text = json.dumps({"id": number, "nested": [number]})
    value = loads(text if kind is str else text.encode())
    assert value == {"id": number, "nested": [number]} and isinstance(value["id"], int)
    assert loads(dumps(value)) == value


def test_what_orjson_reads_right_is_read_as_before():
    assert loads('{"a": 18446744073709551615, "b": -9223372036854775808, "c": 1.5, "d": "x"}') == {
        "a": 2**64 - 1, "b": -(2**63), "c": 1.5, "d": "x"}
    assert loads(b"[NaN]")[0] != loads(b"[NaN]")[0]  # json's NaN, which orjson refuses
    assert loads('{"digits": "1234567890123456789012"}') == {"digits": "1234567890123456789012"}


def test_a_floats_long_digits_stay_on_orjsons_path(monkeypatch):
    """The per-token path (vLLM's stream, its logprobs) pays for json only where an integer is long."""
    import looptrace.common.jsonio as jsonio

    def refused(text):
        raise AssertionError(f"json read {text!r}")

    monkeypatch.setattr(jsonio.json, "loads", refused)
    assert loads('{"logprob": -0.0012345678901234567, "big": 1.2345678901234567890e+29}') == {
        "logprob": -0.0012345678901234567, "big": 1.2345678901234567890e+29}


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', '[-Infinity]', '{"a": 1e400}', '{"a": -1e400}',
                                  '{"a": 1e400, "c": 123456789012345678901234567890}'])
def test_loads_strict_refuses_what_strict_readers_refuse(text):
    """Issue 53, M1: a client's arguments holding these were written back out as NaN and Infinity."""
    from looptrace.common.jsonio import loads_strict

    with pytest.raises(ValueError):
        loads_strict(text)


def test_loads_strict_reads_json_whole():
    from looptrace.common.jsonio import loads_strict

    assert loads_strict('{"c": 123456789012345678901234567890, "f": 1.5e300, "s": "\\ud800"}') == {
        "c": 123456789012345678901234567890, "f": 1.5e300, "s": "\ud800"}


def test_an_export_line_is_strict_json_whatever_it_holds():
    from looptrace.common.jsonio import dumps_line

    line = dumps_line({"logprobs": [-0.5, float("-inf")], "x": {"y": [float("nan")]}, "n": 10**30, "s": "\ud800"})
    assert line == '{"logprobs": [-0.5, null], "x": {"y": [null]}, "n": 1000000000000000000000000000000, "s": "\\ud800"}'
