"""The state store's records of a client's text sealed at rest: AES-GCM (the `cryptography` package).

Stored Responses responses and their conversations, compaction summaries and each conversation's last
turn (its prompt's and answer's token ids) keep the client's text verbatim, redaction or not: the model
must get the real text back on the next turn. So those columns are sealed, each record under a random
96-bit nonce, with its table and key (a response id or conversation key, which names the tenant) as
associated data: a row copied under another key, or another tenant's, fails its tag.

The key is derived (HKDF-SHA256) from the server secret API keys are hashed under
(trace_store/server_secret.py, which api_keys.py hashes keys under), so every worker and every host sharing LOOPTRACE_KEY_SECRET
reads what any of them wrote, and nothing of it is in the store.

A sealed record starts with MAGIC; a record without it was written before sealing (a plaintext
`j`/`z` JSON blob, or packed ids) and is read as it is, then sealed when next written. A sealed record
that does not open (the secret changed, or the row was moved) reads as absent, which callers already
answer as unknown (a 404, a new conversation).
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .server_secret import server_secret

# Version 1. Not a packed JSON blob's first byte (`j`, `z`), and as a token id (int32, little-endian) it
# is 827,608,319: no vocabulary's, so old packed ids are never taken for a sealed record.
MAGIC = b"\xffLT1"
NONCE = 12
_INFO = b"looptrace state records v1"


class Sealer:
    def __init__(self, secret: bytes) -> None:
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(secret)
        self._aead = AESGCM(key)

    def seal(self, data: bytes, table: str, key: str) -> bytes:
        nonce = os.urandom(NONCE)
        return MAGIC + nonce + self._aead.encrypt(nonce, data, _associated(table, key))

    def open(self, data: bytes, table: str, key: str) -> bytes | None:
        """The record's bytes; a record from before sealing as it is; None for one that does not open."""
        data = bytes(data)
        if not data.startswith(MAGIC):
            return data
        body = data[len(MAGIC):]
        try:
            return self._aead.decrypt(body[:NONCE], body[NONCE:], _associated(table, key))
        except InvalidTag:
            return None


def is_sealed(data: bytes | None) -> bool:
    return data is not None and bytes(data).startswith(MAGIC)


def _associated(table: str, key: str) -> bytes:
    return f"{table}\0{key}".encode("utf-8", "surrogatepass")


def this_hosts_sealer() -> Sealer:
    """Under this host's server secret (the environment's, else this machine's file)."""
    return Sealer(server_secret())
