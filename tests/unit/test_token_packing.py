"""Token events stored packed (trace_store/packing.py): read back exactly as the JSON they replace
would read, whatever the values (checked on random groups), at most 64 bytes a token with its top
five, and a store's older rows (tokens kept as JSON) still read the same, on both stores."""

from __future__ import annotations

import math
import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps, loads
from looptrace.trace_store import batch, packing
from looptrace.trace_store.tokens import GROUP, columns

from token_groups import PIECES, answer, event, float32

# Logprobs as backends give them (at most 0; an upstream's NaN or -inf too), float32 ones most often.
FLOATS = st.one_of(st.floats(max_value=0.0), st.sampled_from([0.0, -0.0, math.nan, -math.inf]),
                   st.floats(-30, 0).map(float32))


@st.composite
def token_events(draw):
    n_top = draw(st.integers(0, 5))
    logprob = draw(FLOATS)
    top = [draw(FLOATS) for _ in range(n_top)]
    token_id = draw(st.integers(-1, len(PIECES) - 1))
    return {**event(draw(st.integers(0, 10**6)), token_id, logprob, draw(st.sampled_from([None, 1, 2, 6, 10**6])),
                    [draw(st.integers(-1, len(PIECES) - 1)) for _ in top], top),
            "text": draw(st.text(max_size=6)), "special": draw(st.booleans()),
            "drafted": draw(st.integers(0, 1)), "accepted": draw(st.integers(0, 1)),
            "draft_method": draw(st.sampled_from(["", "ngram", "suffix", "mtp"]))}


@settings(max_examples=150, deadline=None)
@given(st.lists(token_events(), min_size=1, max_size=150), st.booleans(), st.integers(0, 2**63 - 10**12))
def test_packed_groups_read_back_as_their_json(events, content, start_ns):
    groups = [columns(events[i:i + GROUP], [random.choice(["thought", "content", "tool_call"])
                                            for _ in events[i:i + GROUP]],
                      [start_ns + j * 1000 for j in range(len(events[i:i + GROUP]))], PIECES if content else None)
              for i in range(0, len(events), GROUP)]
    as_json = loads(dumps(groups))
    unpacked = packing.unpack(packing.pack(groups))
    assert dumps(unpacked) == dumps(as_json)  # the same values, types, order and nulls


@pytest.mark.parametrize("odd", [
    {attr.TOKENS_INDEX: [3, 1, 2], attr.TOKENS_ID: [2**70, 1, 2]},  # an integer past 64 bits
    {attr.TOKENS_INDEX: [0, 1], attr.TOKENS_P: [1, 0.5]},  # an int among floats: JSON keeps "1"
    {attr.TOKENS_INDEX: [0, 1], attr.TOKENS_TEXT: ["a\x00b", "\ud800x"]},  # NUL, a lone surrogate
    {attr.TOKENS_INDEX: [0, 1], attr.TOKENS_ID: [5, 5], attr.TOKENS_PIECE: ["a", "b"]},  # one id, two pieces
    {attr.TOKENS_INDEX: [0, 1], attr.TOKENS_CHANNEL: [None, "x"], attr.TOKENS_RANK: [None, None]},
    {attr.TOKENS_INDEX: [], attr.TOKENS_ID: []},
    {attr.TOKENS_INDEX: [0], attr.TOKENS_TIME_UNIX_NANO: [-(2**63)]},
])
def test_values_no_encoding_fits_are_kept_as_json(odd):
    import json

    expected = json.loads(json.dumps([odd]))  # what the store's JSON (json, where orjson refuses) reads as
    assert packing.unpack(packing.pack([odd])) == expected


def test_groups_of_different_columns_stay_json():
    with pytest.raises(packing.Unpackable):
        packing.pack([{attr.TOKENS_INDEX: [0], attr.TOKENS_P: [0.5]}, {attr.TOKENS_INDEX: [1]}])
    events = [{"name": attr.EVENT_TOKENS, "attributes": {attr.TOKENS_INDEX: [0], attr.TOKENS_P: [0.5]}},
              {"name": attr.EVENT_TOKENS, "attributes": {attr.TOKENS_INDEX: [1]}}]
    assert batch.packed_events(events) == (events, None)


def test_an_answer_with_its_top_five_takes_at_most_64_bytes_a_token():
    groups = answer(1000, seed=7)
    json_size, packed_size = len(dumps(groups)), len(packing.pack(groups))
    assert packed_size / 1000 <= 64, (json_size / 1000, packed_size / 1000)
    assert json_size / packed_size > 4


def test_float32_logprobs_take_four_bytes_and_their_probabilities_none():
    groups = answer(64, seed=1)
    header = _header(packing.pack(groups))
    kinds = {_name(name): kind for name, _, kind, *_ in header["columns"] if kind != "table"}
    assert kinds[attr.TOKENS_P] == "exp_of" and kinds[attr.TOKENS_LOGPROB] == "f32"
    assert kinds[attr.TOKENS_TOP_P] == "exp32" and kinds[attr.TOKENS_INDEX] == "run"
    assert kinds[attr.TOKENS_PIECE] == kinds[attr.TOKENS_TOP_PIECES] == "pieces"
    # A logprob float32 cannot hold (an upstream's float64) is kept whole.
    groups[0][attr.TOKENS_LOGPROB][0] = -0.1
    groups[0][attr.TOKENS_P][0] = math.exp(-0.1)
    kinds = {_name(name): kind for name, _, kind, *_ in _header(packing.pack(groups))["columns"]
             if kind != "table"}
    assert kinds[attr.TOKENS_LOGPROB] == "f64"
    assert packing.unpack(packing.pack(groups)) == loads(dumps(groups))


# Packed by looptrace before the draft_method column (issue 29), tokens 0-2 with ids, pieces and marks.
OLD_BLOB = bytes.fromhex(
    "0178014d8c310e83301004cf453eb2f516184293af5814d8b2222430087015e50bbc993351a25cb33ba3d51d22f2c2739df3b2e1e19a"
    "8e08f398a754c801ac88bdf763041d3ca8834f6ad35ad1126b4eba53aa7fd42a3585962186b881b50a7b9921ede0f795bd97d19feade37"
    "53aef7418c112327d0732830")


def test_the_draft_method_column_is_appended_and_older_blobs_still_read():
    # Columns are named in a blob by their place in packing.COLUMNS: a new one goes at the end.
    assert packing.COLUMNS[-1] == attr.TOKENS_DRAFT_METHOD and packing.COLUMNS.index(attr.TOKENS_ACCEPTED) == 14
    assert packing.unpack(OLD_BLOB) == [{attr.TOKENS_INDEX: [0, 1, 2], attr.TOKENS_ID: [5, 6, 7],
                                         attr.TOKENS_PIECE: ["a", "b", "c"], attr.TOKENS_DRAFTED: [0, 1, 1],
                                         attr.TOKENS_ACCEPTED: [0, 1, 0]}]
    group = {attr.TOKENS_INDEX: list(range(200)), attr.TOKENS_DRAFT_METHOD: ["", "suffix", "suffix", "ngram"] * 50}
    blob = packing.pack([group])
    (column,) = [c for c in _header(blob)["columns"] if c[0] == len(packing.COLUMNS) - 1]
    assert column[2] == "choice" and column[3] == ["", "suffix", "ngram"]  # a few values, indexed: a byte a token
    assert packing.unpack(blob) == [group]


def _name(column) -> str:
    return packing.COLUMNS[column] if type(column) is int else column


def _header(blob: bytes) -> dict:
    import zlib

    raw = blob[1:] if blob[0] & packing.RAW else zlib.decompress(blob[1:])
    return loads(raw[4:4 + int.from_bytes(raw[:4], "little")])


def test_rows_stored_before_packing_read_the_same(stores, monkeypatch):
    """A store written by an older looptrace kept tokens as JSON: such a row reads as a packed one does."""
    groups = answer(150, seed=3)
    traces = {}
    for packed in (True, False):
        store = stores.make()
        if not packed:
            monkeypatch.setattr(batch, "pack", _refuse)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(store))
        root = provider.get_tracer("t").start_span("chat m", attributes={attr.ENDPOINT: "chat"}, start_time=10)
        decode = provider.get_tracer("t").start_span(attr.SPAN_DECODE, context=trace.set_span_in_context(root),
                                                     start_time=20)
        for i, group in enumerate(groups):
            decode.add_event(attr.EVENT_TOKENS, group, timestamp=1000 + i)
        decode.end(end_time=30)
        root.end(end_time=40)
        trace_id = format(root.get_span_context().trace_id, "032x")
        stored = stores.sql(store, "SELECT tokens FROM spans WHERE name = ?", (attr.SPAN_DECODE,))
        assert (stored[0][0] is not None) is packed
        found = store.get_trace(trace_id)
        traces[packed] = (found["spans"], store.tokens(trace_id)["tokens"])
    (packed_spans, packed_tokens), (json_spans, json_tokens) = traces[True], traces[False]
    strip = lambda spans: [{k: v for k, v in s.items() if k not in ("trace_id", "span_id", "parent_span_id")}  # noqa: E731
                           for s in spans]
    assert strip(packed_spans) == strip(json_spans) and packed_tokens == json_tokens
    assert len(packed_tokens) == 150 and packed_tokens[0]["top_pieces"]


def _refuse(groups):
    raise packing.Unpackable("as an older looptrace")


def test_a_version_3_sqlite_store_is_upgraded_and_its_rows_read(tmp_path):
    import sqlite3

    from looptrace.trace_store.sqlite.schema import VERSION
    from looptrace.trace_store.sqlite.store import SQLiteTraceStore

    path = tmp_path / "v3.sqlite3"
    store = SQLiteTraceStore(path)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(store))
    root = provider.get_tracer("t").start_span("chat m", attributes={attr.ENDPOINT: "chat"})
    root.add_event(attr.EVENT_TOKENS, answer(3, seed=2)[0])
    root.end()
    trace_id = format(root.get_span_context().trace_id, "032x")
    before = store.get_trace(trace_id)
    store.shutdown()
    with sqlite3.connect(path) as db:  # as version 3 had it: no tokens column, tokens in the JSON
        events = [{**e, "attributes": packing.restored([e], blob)[0]["attributes"]}
                  for e, blob in [(loads(r[0])[0], r[1]) for r in db.execute("SELECT events, tokens FROM spans")]]
        db.execute("UPDATE spans SET events = ?", (dumps(events),))
        db.execute("ALTER TABLE spans DROP COLUMN tokens")
        db.execute("PRAGMA user_version = 3")
    reopened = SQLiteTraceStore(path)
    reopened.open()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == VERSION
        assert db.execute("SELECT tokens FROM spans").fetchone() == (None,)
    assert reopened.get_trace(trace_id) == before


def test_shuffled_arrays_come_back_whole():
    values = array("i", [random.randrange(-2**31, 2**31) for _ in range(1000)])
    assert packing._unshuffled(packing._shuffled(array("i", values)), "i") == values
