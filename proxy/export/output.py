"""Where `looptrace export` writes (`--out`, else standard output): a path that cannot be written is
refused before the store is read, and a write that fails (a full disk, a folder removed meanwhile) is
said in a line, as every refusal of the command is (issue 41, L2: each was a traceback)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from looptrace.trace_store.recorded_sessions import ReplayError


def out_refusal(out: str | None) -> str | None:
    """Why --out cannot be written, said before the store is read (a folder, or one that is not there)."""
    if out is None:
        return None
    path = Path(out)
    if path.is_dir():
        return f"--out {out} is a folder; give a file's path"
    if not path.parent.is_dir():
        return f"--out {out}: there is no folder {path.parent} to write it in"
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"--out {out} cannot be written: permission denied"
    return None


@contextlib.contextmanager
def writing(out: str | None) -> Iterator[None]:
    """A failure to write --out (a full disk, a folder gone meanwhile) said in a line, as a refusal is.
    A reader of standard output that stops early (`| head`) is no failure: the export ends quietly."""
    try:
        yield
    except BrokenPipeError:
        if out is not None:
            raise ReplayError(f"cannot write --out {out}: broken pipe") from None
        # What Python's docs advise: stdout pointed at /dev/null, so that its flush at exit raises nothing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None
    except OSError as exc:
        raise ReplayError(f"cannot write {f'--out {out}' if out else 'standard output'}: "
                          f"{exc.strerror or exc}") from exc
