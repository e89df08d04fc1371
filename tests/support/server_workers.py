"""A `looptrace serve --workers N` seen from outside: its workers' processes, their log lines, and each
worker's own metric files (prometheus_client's multiprocess files, which the supervisor puts in a
fresh folder named in each worker's environment)."""

from __future__ import annotations

import re
from pathlib import Path

READY = re.compile(r"\[worker (\d+)\]: ready: ")
RESTARTED = re.compile(r"worker (\d+) \(pid (\d+)\) (.+?); restarting it")


def all_ready(log: str, workers: int) -> bool:
    """Whether every worker slot has said it is ready at least once."""
    return {int(m.group(1)) for m in READY.finditer(log)} >= set(range(workers))


def ready_count(log: str, slot: int) -> int:
    return sum(1 for m in READY.finditer(log) if int(m.group(1)) == slot)


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (the supervisor's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def slot_of(pid: int) -> int:
    """A worker's slot, from its command line (`--worker-slot N`)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return int(argv[argv.index(b"--worker-slot") + 1])


def metrics_dir(pid: int) -> Path:
    """The multiprocess metrics folder a worker writes to (PROMETHEUS_MULTIPROC_DIR in its environment)."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"PROMETHEUS_MULTIPROC_DIR="):
            return Path(item.split(b"=", 1)[1].decode())
    raise AssertionError(f"worker {pid} has no PROMETHEUS_MULTIPROC_DIR")


def counted_by_pid(folder: Path, name: str, **labels: str) -> dict[int, float]:
    """One counter's (or histogram sample's) value in each process's own file, by pid: what each
    worker counted, read with prometheus_client's own reader, file by file."""
    from prometheus_client.multiprocess import MultiProcessCollector

    found: dict[int, float] = {}
    for path in folder.glob("*.db"):
        if not path.name.startswith(("counter_", "histogram_")):
            continue
        pid = int(path.stem.rsplit("_", 1)[1])
        for family in MultiProcessCollector.merge([str(path)], accumulate=True):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    found[pid] = found.get(pid, 0.0) + sample.value
    return found
