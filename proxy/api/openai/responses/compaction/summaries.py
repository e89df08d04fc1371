"""Where the summaries that compactions write are kept, and the references a `compaction` item carries.

A client gets no summary: its `encrypted_content` is a reference, `lt1.<id>.<mac>`, to the summary kept
in the trace store's state (trace_store/state.py), so that any process serving that store, or one
restarted since, expands it; and it holds nothing the chat template gives meaning to. The MAC (HMAC-
SHA256 of the id and the summary's SHA-256) is made with a key kept in the same state (`state_secrets`):
the first process to compact makes it, every process serving the store reads the same one, and a
restart finds it again. A reference altered, signed by another deployment's key, or naming a summary
altered in the store fails its check; one whose summary was pruned (the newest MAX_COMPACTIONS are
kept) is unknown. Either is refused, never rendered as something else.

With no store (`--trace-db off`) the summaries and the key are this process's own: its references mean
nothing to another process, or to itself once restarted. A summary the store did not take (it did not
answer) is kept in this process's memory instead, served from there, and said once in the log; the key
is read from the store before a compaction runs, so one that does not answer refuses the compaction
(a 503) rather than sign with a key no other process knows.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from aiohttp import web

from looptrace.trace_store.state import MAX_COMPACTIONS, StateStore

from ....auth import within
from .....observe.conversations import Bounded

log = logging.getLogger("looptrace")

PREFIX = "lt1"  # the reference format's version
KEY_NAME = "compaction_mac"
WAIT = 5.0  # seconds a request waits for the store


class Unresolved(NamedTuple):
    """Why a reference expands to nothing: `reason` as the client is told it, `kind` as it is counted."""

    kind: str  # malformed | tampered | unknown
    reason: str


def new_id() -> str:
    return secrets.token_hex(16)


def _mac(key: bytes, compaction_id: str, summary: str) -> str:
    digest = hashlib.sha256(summary.encode()).hexdigest()
    return hmac.new(key, f"{compaction_id}.{digest}".encode(), hashlib.sha256).hexdigest()


def _parts(reference: object) -> tuple[str, str] | None:
    if not isinstance(reference, str):
        return None
    parts = reference.split(".")
    if len(parts) != 3 or parts[0] != PREFIX or len(parts[1]) != 32 or len(parts[2]) != 64:
        return None
    if not all(c in "0123456789abcdef" for c in parts[1] + parts[2]):
        return None
    return parts[1], parts[2]


class Summaries:
    """In this process's memory (`--trace-db off`), bounded like the store."""

    def __init__(self) -> None:
        self._kept: Bounded = Bounded(MAX_COMPACTIONS)
        self._key: bytes | None = None

    async def key(self) -> bytes:
        if self._key is None:
            self._key = secrets.token_bytes(32)
        return self._key

    async def _put(self, compaction_id: str, summary: str, conversation: str | None, trace_id: str | None) -> None:
        self._kept.remember(compaction_id, summary)

    async def _get(self, compaction_id: str) -> str | None:
        return self._kept.get(compaction_id)

    def sign(self, compaction_id: str, summary: str) -> str:
        """The reference to a summary, for the client (the key was read when the request was planned)."""
        assert self._key is not None, "the key is read before a compaction runs (compaction.plan)"
        return f"{PREFIX}.{compaction_id}.{_mac(self._key, compaction_id, summary)}"

    async def keep(self, compaction_id: str, summary: str, *, conversation: str | None = None,
                   trace_id: str | None = None) -> None:
        await self._put(compaction_id, summary, conversation, trace_id)

    async def expand(self, reference: object, tenant: str | None = None) -> str | Unresolved:
        """The summary a reference names, or why there is none; within `tenant`'s summaries alone, so that
        another tenant's reference is one of an unknown summary."""
        parts = _parts(reference)
        if parts is None:
            return Unresolved("malformed", "it is not a compaction this server made")
        compaction_id, mac = parts
        summary = await self._get(within(tenant, compaction_id))
        if summary is None:
            return Unresolved("unknown", "no summary of that id is kept here: expired, or made by another server")
        if not hmac.compare_digest(mac, _mac(await self.key(), compaction_id, summary)):
            return Unresolved("tampered", "its signature does not match: altered, or signed by another server")
        return summary

    def close(self) -> None:
        pass


class SharedSummaries(Summaries):
    """In the trace store's state, for every process serving it; this process's memory as a fallback."""

    def __init__(self, state: StateStore) -> None:
        super().__init__()
        self.state = state
        self._threads = ThreadPoolExecutor(2, thread_name_prefix="looptrace-summaries")
        self._said = False

    async def _call(self, method, *args):
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self._threads, method, *args), WAIT)

    async def key(self) -> bytes:
        # Read from the store until it answers: a key of this process's own would sign references no
        # other process could check.
        if self._key is None:
            self._key = await self._call(self.state.secret, KEY_NAME, secrets.token_bytes(32))
        return self._key

    async def _put(self, compaction_id: str, summary: str, conversation: str | None, trace_id: str | None) -> None:
        try:
            await self._call(self.state.put_compaction, compaction_id, summary, conversation, trace_id)
        except Exception as exc:  # noqa: BLE001 - kept here; only another process will miss it
            self._unshared(exc)
            self._kept.remember(compaction_id, summary)  # memory holds only what the store may lack

    async def _get(self, compaction_id: str) -> str | None:
        try:
            found = await self._call(self.state.get_compaction, compaction_id)
        except Exception as exc:  # noqa: BLE001 - served from memory, if this process kept it there
            self._unshared(exc)
            found = None
        return found if found is not None else self._kept.get(compaction_id)

    def _unshared(self, exc: Exception) -> None:
        if not self._said:
            self._said = True
            log.warning("compaction summaries are kept in this process only while the store at %s does not "
                        "answer (%s)", self.state.where, str(exc).strip() or type(exc).__name__)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


SUMMARIES: web.AppKey[Summaries] = web.AppKey("compaction_summaries", Summaries)
