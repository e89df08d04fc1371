"""The server secret: what API keys are hashed under (api_keys.py) and the state store's records are
sealed with (sealing.py), so that neither is readable from the store alone.

It is `LOOPTRACE_KEY_SECRET` where set (several hosts share one), else a file made once, mode 0600, in
looptrace's data directory, so that `looptrace keys create` and `looptrace serve` on one machine agree
with no setup.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

SECRET_ENV = "LOOPTRACE_KEY_SECRET"


def server_secret(data_dir: str | Path | None = None) -> bytes:
    """The environment's secret, else this machine's file (made once)."""
    given = os.environ.get(SECRET_ENV)
    if given:
        return given.encode()
    if data_dir is None:
        from platformdirs import user_data_dir

        data_dir = user_data_dir("looptrace")
    path = Path(data_dir) / "api-key-secret"
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    made = secrets.token_urlsafe(32).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: its secret is the one
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as out:
        out.write(made)
    return made
