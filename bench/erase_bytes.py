"""Which way an erasure's bytes leave a SQLite file, and what each costs (trace_store/erasure.py).

    python bench/erase_bytes.py [--mb 100]

A store-shaped file (a table of JSON rows and an FTS5 index over their text, in WAL mode) written with
secure_delete OFF (what many SQLite builds default to; Debian's is ON), one session's rows updated once
(an UPDATE leaves the old cell in the page's free space), then that session erased: rows deleted with
secure_delete ON, the FTS index optimized, the log checkpointed (TRUNCATE); then VACUUM. After each
step: how often the session's marker is still in the files' bytes, and the step's time.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from pathlib import Path


def found(folder: Path, marker: bytes) -> int:
    return sum(p.read_bytes().lower().count(marker.lower()) for p in folder.iterdir() if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    mb = parser.parse_args().mb
    folder = Path(tempfile.mkdtemp())
    path = folder / "traces.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA secure_delete = OFF")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("CREATE TABLE spans (trace_id TEXT, attributes TEXT)")
    db.execute("CREATE VIRTUAL TABLE trace_text USING fts5(trace_id UNINDEXED, text)")
    marker = b"ZQXERASEDMARKER"
    filler = os.urandom(1500).hex()  # 3 KB a row
    rows = mb * 1024 * 1024 // 3000
    db.execute("BEGIN")
    for n in range(rows):
        session = "erased" if n % 1000 == 0 else "kept"
        text = f"{session} {marker.decode() if session == 'erased' else 'ordinary'} words {n} {filler[:200]}"
        db.execute("INSERT INTO spans VALUES (?, ?)", (f"{session}-{n}", f'{{"text": "{text}", "x": "{filler}"}}'))
        db.execute("INSERT INTO trace_text VALUES (?, ?)", (f"{session}-{n}", text))
    db.execute("COMMIT")
    db.execute("UPDATE spans SET attributes = attributes || ' ' WHERE trace_id LIKE 'erased-%'")  # the old cells stay
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = path.stat().st_size / 2**20
    print(f"{size:.0f} MB file, {rows} rows, {rows // 1000 + 1} erased; marker found {found(folder, marker)} times")
    db.execute("PRAGMA secure_delete = ON")
    steps = [("delete (secure_delete ON)", ["DELETE FROM spans WHERE trace_id LIKE 'erased-%'",
                                            "DELETE FROM trace_text WHERE trace_id LIKE 'erased-%'"]),
             ("FTS5 optimize", ["INSERT INTO trace_text (trace_text) VALUES ('optimize')"]),
             ("wal_checkpoint(TRUNCATE)", ["PRAGMA wal_checkpoint(TRUNCATE)"]),
             ("VACUUM + checkpoint", ["VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)"])]
    for name, statements in steps:
        start = time.perf_counter()
        for statement in statements:
            db.execute(statement).fetchall()
        print(f"{name:28s} {time.perf_counter() - start:7.2f} s   marker left: {found(folder, marker)}")


if __name__ == "__main__":
    main()
