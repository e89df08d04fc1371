"""A turn's message digests (proxy/observe/conversations.py): a message whose JSON is the one its
conversation's last request had at the same place takes the kept digest; every other message is
digested; the result is always each message's own digest, whatever was kept."""

from __future__ import annotations

from looptrace.proxy.engine.turn_digests import digest
from looptrace.proxy.observe import conversations
from looptrace.proxy.observe.conversations import Conversations

FIRST = ['{"role":"system","parts":[]}', '{"role":"user","parts":[{"type":"text","content":"go"}]}']
SECOND = [*FIRST, '{"role":"assistant","parts":[]}', '{"role":"tool","parts":[]}']


class Counted(Conversations):
    """The stored digest (BLAKE2b), counting the texts it digests."""

    def __init__(self) -> None:
        super().__init__()
        self.digested: list[str] = []

    def digest(self, message: str) -> int:
        self.digested.append(message)
        return digest(message)


def copies(texts: list[str]) -> list[str]:
    """The same texts as new objects, as the next request's JSON is."""
    return [("x" + t)[1:] for t in texts]


def test_a_turn_digests_only_the_messages_it_adds():
    owner = Counted()
    assert owner.digests("c", FIRST) == [digest(m) for m in FIRST]
    owner.digested.clear()
    assert owner.digests("c", copies(SECOND)) == [digest(m) for m in SECOND]
    assert owner.digested == SECOND[2:]


def test_an_edited_message_is_digested_again_and_the_rest_kept():
    owner = Counted()
    owner.digests("c", SECOND)
    edited = [SECOND[0], '{"role":"user","parts":[{"type":"text","content":"stop"}]}', *SECOND[2:]]
    owner.digested.clear()
    assert owner.digests("c", edited) == [digest(m) for m in edited]
    assert owner.digested == [edited[1]]


def test_a_shorter_or_other_conversation_is_its_own():
    owner = Counted()
    owner.digests("c", SECOND)
    assert owner.digests("c", FIRST[:1] + ['{"role":"user"}']) == [digest(FIRST[0]), digest('{"role":"user"}')]
    owner.digested.clear()
    assert owner.digests("other", SECOND) == [digest(m) for m in SECOND]
    assert owner.digested == SECOND
    assert owner.digests(None, FIRST) == [digest(m) for m in FIRST]


def test_what_is_kept_stays_within_its_bytes(monkeypatch):
    monkeypatch.setattr(conversations, "MAX_DIGESTED_BYTES", 4 * sum(map(len, SECOND)) + 16 * len(SECOND))
    owner = Counted()
    owner.digests("a", SECOND)
    owner.digests("b", SECOND)  # "a" is forgotten: both do not fit
    owner.digested.clear()
    assert owner.digests("a", SECOND) == [digest(m) for m in SECOND]
    assert owner.digested == SECOND
    owner.digests("a", [*SECOND, "x" * 1000])  # too big to keep: nothing of "a" is kept
    owner.digested.clear()
    owner.digests("a", SECOND)
    assert owner.digested == SECOND


def test_a_turn_keeps_its_digests_for_the_next():
    owner = Conversations()
    turn = owner.begin("c")
    assert turn.new_messages_from(FIRST) == (0, None)
    turn.trace_id = "t1"
    turn.end()
    turn = owner.begin("c")
    assert turn.new_messages_from(copies(SECOND)) == (2, "t1")
    assert turn.digests == [hash(m) for m in SECOND]
