"""Compaction summaries in the trace store's state (trace_store/state.py, api/openai/responses/compaction/summaries.py): one
process signs and keeps a summary, another expands it; the key is one for every process and survives
them; the newest summaries are kept; while the store does not answer, a compaction is refused plainly
and nothing else fails. Two objects on one store stand for two processes; SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio

import pytest

from looptrace.proxy.api.errors import APIError
from looptrace.proxy.api.openai.responses.compaction import plan as compaction
from looptrace.proxy.api.openai.responses.compaction import summaries as summaries_module
from looptrace.proxy.api.openai.responses.compaction.summaries import SharedSummaries, Summaries, Unresolved, new_id
from looptrace.trace_store import state as state_module

from stores import SilentState


async def made(summaries: Summaries, text: str) -> str:
    await summaries.key()
    compaction_id = new_id()
    reference = summaries.sign(compaction_id, text)
    await summaries.keep(compaction_id, text, conversation="agent-1", trace_id="a" * 32)
    return reference


def test_a_summary_kept_by_one_process_is_expanded_by_another(stores):
    setting = stores.setting()
    a, b = SharedSummaries(stores.state(setting)), SharedSummaries(stores.state(setting))

    async def run():
        reference = await made(a, "SUMMARY: ls ran.")
        assert await b.expand(reference) == "SUMMARY: ls ran."
        assert await b.key() == await a.key()  # one key for every process: the first one's, kept
        # A process started later (a restart) finds the same key.
        assert await SharedSummaries(stores.state(setting)).expand(reference) == "SUMMARY: ls ran."

    asyncio.run(run())


def test_an_altered_summary_or_reference_is_refused(stores):
    setting = stores.setting()
    summaries = SharedSummaries(stores.state(setting))

    async def run():
        reference = await made(summaries, "SUMMARY: ls ran.")
        _, compaction_id, mac = reference.split(".")
        # Signed by another deployment's key.
        other = Summaries()
        await other.key()
        assert (await summaries.expand(other.sign(compaction_id, "SUMMARY: ls ran."))).kind == "tampered"
        # The summary altered in the store: the MAC covers its digest.
        summaries.state._write([("UPDATE state_compactions SET summary = ? WHERE id = ?",
                                 (state_module.pack_json("SUMMARY: ls ran, then rm -rf ~."), compaction_id))])
        assert (await summaries.expand(reference)).kind == "tampered"
        for junk in ("", "lt1", "lt1.x.y", f"lt2.{compaction_id}.{mac}", "<|im_end|>", None, 7):
            assert (await summaries.expand(junk)).kind == "malformed"

    asyncio.run(run())


def test_the_newest_summaries_are_kept(stores, monkeypatch):
    monkeypatch.setattr(state_module, "MAX_COMPACTIONS", 2)
    summaries = SharedSummaries(stores.state(stores.setting()))

    async def run():
        references = [await made(summaries, f"SUMMARY {n}") for n in range(3)]
        first = await summaries.expand(references[0])
        assert isinstance(first, Unresolved) and first.kind == "unknown" and "expired" in first.reason
        assert [await summaries.expand(r) for r in references[1:]] == ["SUMMARY 1", "SUMMARY 2"]

    asyncio.run(run())


def test_while_the_store_does_not_answer_a_compaction_is_refused_plainly(monkeypatch):
    monkeypatch.setattr(summaries_module, "WAIT", 0.5)
    summaries = SharedSummaries(SilentState(False))

    async def run():
        with pytest.raises(APIError) as info:
            await compaction._key(summaries)
        assert (info.value.status, info.value.code) == (503, "compaction_store_unavailable")
        assert "postgresql://nowhere/x" in info.value.message and "connection refused" in info.value.message

    asyncio.run(run())


def test_a_summary_the_store_did_not_take_is_served_from_memory(monkeypatch, caplog):
    """The key was read while the store answered; then it stopped: the summary is kept in this process
    (said in the log), and this process expands it."""
    monkeypatch.setattr(summaries_module, "WAIT", 0.5)
    summaries = SharedSummaries(SilentState(False))
    summaries._key = b"k" * 32  # read before the store stopped answering

    async def run():
        reference = await made(summaries, "SUMMARY: kept here.")
        assert await summaries.expand(reference) == "SUMMARY: kept here."

    asyncio.run(run())
    assert "kept in this process only" in caplog.text
