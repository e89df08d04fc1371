"""Stop strings cut the text exactly where they begin, however the text is split."""

import pytest

from looptrace.proxy.engine.stops import StopStrings

TEXT = "The answer is 42.\nObservation: done"


def run(pieces, stops):
    s = StopStrings(stops)
    out = []
    for piece in pieces:
        out.append(s.feed(piece))
        if s.hit:
            break
    if not s.hit:
        out.append(s.flush())
    return "".join(out), s.hit


@pytest.mark.parametrize("stops, expected, hit", [
    (["Observation:"], "The answer is 42.\n", True),
    (["\n", "42"], "The answer is ", True),
    (["nowhere"], TEXT, False),
    (["done!"], TEXT, False),  # a prefix at the very end is just text
])
def test_every_split(stops, expected, hit):
    for i in range(len(TEXT) + 1):
        for j in range(i, len(TEXT) + 1):
            assert run([TEXT[:i], TEXT[i:j], TEXT[j:]], stops) == (expected, hit)
    assert run(list(TEXT), stops) == (expected, hit)


def test_nothing_is_held_back_that_cannot_start_a_stop():
    s = StopStrings(["###"])
    assert s.feed("abc#") == "abc"
    assert s.feed("x") == "#x"
