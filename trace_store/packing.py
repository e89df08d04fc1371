"""A decode span's token events, stored as packed arrays instead of JSON.

As JSON a token with its top five cost 160–310 bytes: every id, probability and piece written out
in decimal, five times over for the alternatives. Here the `looptrace.tokens` events of one span
become one blob: each column packed by what its values are, then the whole compressed.

    index            a run (start only)                 time_unix_nano   differences, packed ints
    id, top_ids      packed ints                        rank, drafted…   packed ints (None as a sentinel)
    p                exp(logprob) (nothing stored)      top_p            its float32 log (-1 padding marked)
    logprob          float32 when exact, else float64  special          bytes
    piece, top_pieces one table id → piece per span     channel          a few values, indexed
    text             UTF-8 and lengths                  anything else    JSON (the column as it was)

Reading gives back exactly what the JSON did (`unpack(pack(g)) == loads(dumps(g))`, NaN and
infinities read as null as orjson writes them): an encoding is used only for a column whose every
value it reproduces, checked as it is packed, so a value no encoding fits costs bytes, never
correctness. Numeric arrays are byte-shuffled before compression (the high bytes of ids and the
exponents of floats compress well apart from the noisy low bytes), and the blob is compressed only
where that pays. Written by hand: no library packs columns of Python values to this layout.
"""

from __future__ import annotations

import math
import sys
import zlib
from array import array
from itertools import accumulate, chain
from typing import Sequence

from looptrace.common import attributes as attr
from looptrace.common.jsonio import dumps, loads

FORMAT = 1  # the blob's first byte: FORMAT (compressed) or FORMAT | RAW
RAW = 0x80
LEVEL = 1  # zlib: 6 packs tokens 3 % smaller than 1 for eight times the time (measured here)
PADDING = -1.0  # top_p of a slot past a short list of alternatives (tokens.py)
PIECES_BY = {attr.TOKENS_PIECE: attr.TOKENS_ID, attr.TOKENS_TOP_PIECES: attr.TOKENS_TOP_IDS}
EXP_OF = {attr.TOKENS_P: attr.TOKENS_LOGPROB}
INT_CODES = ("b", "h", "i", "q")
# A column named in the header by its place here (shorter than its name). Stored blobs depend on this
# order: new columns go at the end, never between.
COLUMNS = (attr.TOKENS_INDEX, attr.TOKENS_TIME_UNIX_NANO, attr.TOKENS_ID, attr.TOKENS_PIECE, attr.TOKENS_TEXT,
           attr.TOKENS_SPECIAL, attr.TOKENS_CHANNEL, attr.TOKENS_P, attr.TOKENS_LOGPROB, attr.TOKENS_RANK,
           attr.TOKENS_TOP_IDS, attr.TOKENS_TOP_PIECES, attr.TOKENS_TOP_P, attr.TOKENS_DRAFTED, attr.TOKENS_ACCEPTED,
           attr.TOKENS_DRAFT_METHOD)
KNOWN = {name: i for i, name in enumerate(COLUMNS)}
LITTLE = sys.byteorder == "little"


class Unpackable(ValueError):
    """Groups this format does not hold (a different set of columns per group): kept as JSON."""


def pack(groups: Sequence[dict]) -> bytes:
    """One span's token events' attributes, in order → a blob. Raises Unpackable."""
    if not groups:
        raise Unpackable("no groups")
    names = list(groups[0])
    if any(list(g) != names for g in groups):
        raise Unpackable("groups differ in their columns")
    counts = [_count(g) for g in groups]
    total = sum(counts)
    body = _Body()
    columns = []
    values = {name: _joined(groups, name) for name in names}
    pieces, derived = _piece_table(values)
    if pieces:
        ids = list(pieces)
        steps = [ids[0], *map(int.__sub__, ids[1:], ids)]  # sorted: small steps
        columns.append(["", 0, "table", body.ints(steps), body.strings(list(pieces.values()))])
    for name in names:
        column = values[name]
        per = len(column) // total if total else 1
        if any(len(g[name]) != per * n for g, n in zip(groups, counts)):
            raise Unpackable(f"{name}: not {per} values per token")
        try:
            encoded = _encode(name, column, values, derived, body)
        except Unpackable:  # an integer past 64 bits: the column as JSON
            encoded = ["json", body.add(dumps(column).encode())]
        columns.append([KNOWN.get(name, name), per, *encoded])
    header = dumps({"groups": counts, "columns": columns}).encode()
    raw = len(header).to_bytes(4, "little") + header + body.bytes()
    packed = zlib.compress(raw, LEVEL)
    return bytes([FORMAT]) + packed if len(packed) < len(raw) else bytes([FORMAT | RAW]) + raw


def unpack(blob: bytes) -> list[dict]:
    """A blob → the groups' attributes, as loads(dumps(groups)) gives them."""
    if blob[0] & ~RAW != FORMAT:
        raise ValueError(f"token blob of format {blob[0]}, not {FORMAT}")
    raw = blob[1:] if blob[0] & RAW else zlib.decompress(blob[1:])
    size = int.from_bytes(raw[:4], "little")
    header = loads(raw[4:4 + size])
    reader = _Reader(memoryview(raw)[4 + size:])
    counts = header["groups"]
    total = sum(counts)
    decoded: dict[str, list] = {}
    pieces: dict[int, str] = {}
    order = []
    named = [[COLUMNS[c[0]] if type(c[0]) is int else c[0], *c[1:]] for c in header["columns"]]
    for name, per, kind, *args in named:  # sections are read in order; derived columns after
        if kind == "table":
            pieces = dict(zip(accumulate(_ints(reader, args[0])), _strings(reader, kind, args[1])))
        elif kind not in DERIVED:
            decoded[name] = _decode(kind, args, reader, per * total)
        if kind != "table":
            order.append((name, per))
    for name, per, kind, *args in named:
        if kind == "pieces":
            decoded[name] = [pieces[i] for i in decoded[COLUMNS[args[0]]]]
        elif kind == "exp_of":
            decoded[name] = [math.exp(x) for x in decoded[COLUMNS[args[0]]]]
    groups, start = [], [0] * len(order)
    for n in counts:
        group = {}
        for i, (name, per) in enumerate(order):
            group[name] = decoded[name][start[i]:start[i] + per * n]
            start[i] += per * n
        groups.append(group)
    return groups


def _count(group: dict) -> int:
    index = group.get(attr.TOKENS_INDEX)
    if index is None:
        raise Unpackable("a group without its index column")
    return len(index)


def _joined(groups: Sequence[dict], name: str) -> list:
    out: list = []
    for group in groups:
        value = group[name]
        if not isinstance(value, (list, tuple)):
            raise Unpackable(f"{name} is not an array")
        out += value
    return out


# -- encoding: each returns [kind, *arguments], the sections it wrote appended to the body --

def _encode(name: str, column: list, values: dict, derived: set[str], body: _Body) -> list:
    if name in derived:  # the table was made of this column and its ids, and holds them
        return ["pieces", KNOWN[PIECES_BY[name]]]
    kinds = set(map(type, column))
    if kinds <= {int}:
        return _encode_ints(column, body)
    if kinds <= {bool}:
        return ["bool", body.add(bytes(column))]
    if kinds <= {float}:
        return _encode_floats(name, column, values, body)
    if kinds <= {str}:
        distinct = list(dict.fromkeys(column))
        if len(distinct) <= 16:
            return ["choice", distinct, *body.ints(list(map({v: i for i, v in enumerate(distinct)}.__getitem__, column)))]
        return ["str", *body.strings(column)]
    if kinds <= {int, type(None)} and kinds != {type(None)}:
        sentinel = min(v for v in column if v is not None) - 1
        return ["int?", sentinel, *body.ints([sentinel if v is None else v for v in column])]
    return ["json", body.add(dumps(column).encode())]


def _encode_ints(column: list, body: _Body) -> list:
    if len(column) > 1 and column[1] == column[0] + 1 and column == list(range(column[0], column[0] + len(column))):
        return ["run", column[0]]
    code = _code(column)
    if code == 3 and len(column) > 1:  # past 32 bits: arrival times, milliseconds apart but not since 1970
        steps = list(map(int.__sub__, column[1:], column))
        if _code(steps) < code:
            return ["delta", column[0], *body.ints(steps)]
    return ["int", *body.ints(column, code)]


def _encode_floats(name: str, column: list, values: dict, body: _Body) -> list:
    finite = all(map(math.isfinite, column))
    source = values.get(EXP_OF.get(name))
    if finite and source is not None and len(source) == len(column) and set(map(type, source)) <= {float} and \
            all(map(math.isfinite, source)) and list(map(math.exp, source)) == column:
        return ["exp_of", KNOWN[EXP_OF[name]]]
    logs = _exp_logs(column, finite) if column and max(column) > 0 else None  # not a logprob
    if logs is not None:
        return ["exp32", *body.floats(logs, "f")]
    nulled = column if finite else [v if math.isfinite(v) else math.nan for v in column]
    narrow = array("f", nulled)
    if (narrow.tolist() == column) if finite else _same(narrow.tolist(), nulled):
        return ["f32", *body.floats(narrow, "f")]
    return ["f64", *body.floats(nulled, "d")]


def _exp_logs(column: list, finite: bool) -> array | None:
    """float32 x with exp(x) == v for each v (PADDING as +inf, a non-number as NaN), or None when one
    has none: probabilities are exp of a float32 logprob, so this holds them in 4 bytes. Checked by
    decoding: what reads back must be what JSON would have."""
    log = math.log
    try:
        if finite and column and min(column) > 0:  # the usual case, at C speed: no padding, no zero
            logs = array("f", map(log, column))
            return logs if list(map(math.exp, logs.tolist())) == column else None
        logs = array("f", [log(v) if v > 0 else _log(v) for v in column])
    except (ValueError, OverflowError):
        return None
    expected = column if finite else [v if math.isfinite(v) else None for v in column]
    return logs if _exp_values(logs.tolist()) == expected else None


def _log(v: float) -> float:
    """The log of what math.log refuses: PADDING → +inf, 0 → -inf, anything else → NaN (read as null)."""
    if v == PADDING:
        return math.inf
    return -math.inf if v == 0 else math.nan


def _exp_values(logs: list) -> list:
    exp, inf = math.exp, math.inf
    return [exp(x) if x < inf else (PADDING if x == inf else None) for x in logs]


def _same(a: list, b: list) -> bool:
    return all(x == y or (x != x and y != y) for x, y in zip(a, b))


def _piece_table(values: dict) -> tuple[dict[int, str], set[str]]:
    """id → piece, from every piece column and the id column beside it, and which piece columns it
    holds; none when one id has two pieces (then the pieces are stored as text)."""
    pairs = [(ids, pieces) for pieces, ids in PIECES_BY.items()
             if pieces in values and ids in values and len(values[pieces]) == len(values[ids])]
    all_ids = list(chain.from_iterable(values[ids] for ids, _ in pairs))
    all_pieces = list(chain.from_iterable(values[pieces] for _, pieces in pairs))
    table = dict(zip(all_ids, all_pieces))
    if list(map(table.__getitem__, all_ids)) != all_pieces:  # one piece per id, or none of this
        return {}, set()
    if not set(map(type, table)) <= {int} or not set(map(type, table.values())) <= {str}:
        return {}, set()
    ids = sorted(table)
    return dict(zip(ids, map(table.__getitem__, ids))), {pieces for _, pieces in pairs}


def _code(values: list) -> int:
    """The narrowest packed int code that holds every value (its index in INT_CODES)."""
    low, high = (min(values), max(values)) if values else (0, 0)
    for n, bits in enumerate((8, 16, 32, 64)):
        if -(1 << (bits - 1)) <= low and high < 1 << (bits - 1):
            return n
    raise Unpackable("an integer past 64 bits")


class _Body:
    """The blob's sections, in the order the header names them."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def add(self, data: bytes) -> int:
        self._parts.append(data)
        return len(data)

    def ints(self, values: list, code: int | None = None) -> list:
        letter = INT_CODES[_code(values) if code is None else code]
        return [letter, self.add(_shuffled(array(letter, values)))]

    def floats(self, values, code: str) -> list:
        return [code, self.add(_shuffled(array(code, values)))]

    def strings(self, values: list) -> list:
        """Their lengths in characters, and their text joined, encoded once (lone surrogates kept)."""
        return [*self.ints(list(map(len, values))), self.add("".join(values).encode("utf-8", "surrogatepass"))]

    def bytes(self) -> bytes:
        return b"".join(self._parts)


def _shuffled(packed: array) -> bytes:
    """Byte planes: each value's first bytes together, then its second bytes, … (little-endian)."""
    if not LITTLE:
        packed.byteswap()
    data = packed.tobytes()
    width = packed.itemsize
    return data if width == 1 else b"".join(data[i::width] for i in range(width))


def _unshuffled(data: bytes, code: str) -> array:
    width = array(code).itemsize
    if width > 1:
        n = len(data) // width
        out = bytearray(len(data))
        for i in range(width):
            out[i::width] = data[i * n:(i + 1) * n]
        data = bytes(out)
    packed = array(code, data)
    if not LITTLE:
        packed.byteswap()
    return packed


# -- decoding --

class _Reader:
    """Hands out the body's sections in order."""

    def __init__(self, body: memoryview) -> None:
        self.body, self.at = body, 0

    def take(self, size: int) -> bytes:
        data = bytes(self.body[self.at:self.at + size])
        self.at += size
        return data


def _ints(reader, spec: list) -> list:
    code, size = spec
    return _unshuffled(reader.take(size), code).tolist()


def _strings(reader, _kind, spec: list) -> list:
    code, size, text = spec
    lengths = _unshuffled(reader.take(size), code).tolist()
    joined = reader.take(text).decode("utf-8", "surrogatepass")
    return [joined[end - n:end] for n, end in zip(lengths, accumulate(lengths))]


DERIVED = ("pieces", "exp_of")  # columns computed from others, which hold no section of their own


def _decode(kind: str, args: list, reader, count: int) -> list:
    if kind == "run":
        return list(range(args[0], args[0] + count))
    if kind == "int":
        return _ints(reader, args)
    if kind == "delta":
        return list(accumulate(_ints(reader, args[1:]), initial=args[0]))
    if kind == "int?":
        sentinel = args[0]
        return [None if v == sentinel else v for v in _ints(reader, args[1:])]
    if kind == "bool":
        return [b != 0 for b in reader.take(args[0])]
    if kind == "exp32":
        return _exp_values(_floats(reader, args))
    if kind in ("f32", "f64"):
        return [None if x != x else x for x in _floats(reader, args)]
    if kind == "choice":
        return [args[0][i] for i in _ints(reader, args[1:])]
    if kind == "str":
        return _strings(reader, kind, args)
    if kind == "json":
        return loads(reader.take(args[0]))
    raise ValueError(f"token blob: unknown column kind {kind!r}")


def _floats(reader, spec: list) -> list:
    code, size = spec
    return _unshuffled(reader.take(size), code).tolist()


def restored(events: list[dict], blob: bytes | None) -> list[dict]:
    """A stored span's events with its token events' attributes back in place (as they were before
    packing); a span stored as JSON alone comes back as it is."""
    if blob is None:
        return events
    groups = iter(unpack(blob))
    return [{**e, "attributes": next(groups)} if e.get("name") == attr.EVENT_TOKENS else e for e in events]
