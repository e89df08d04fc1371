"""`--workers` in this process: which settings may have several workers, the supervisor's hold on its
port, and the metrics of several workers summed (prometheus_client's multiprocess mode, two workers
simulated by two process ids). tests/integration/test_workers_processes.py runs real workers."""

from __future__ import annotations

import contextlib
import socket

import pytest
from prometheus_client import values
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from looptrace.proxy import workers
from looptrace.proxy.cli import build_parser, settings_from
from looptrace.proxy.observe import metrics as metrics_module
from looptrace.proxy.observe.metrics import ITL_BUCKETS, Metrics, observe_all


def refusal(*argv: str) -> str | None:
    return workers.refusal(settings_from(build_parser().parse_args(["serve", *argv])))


@pytest.mark.parametrize("argv", [("model-dir",), ("--backend", "local", "model-dir"),
                                  ("--backend", "llama.cpp", "model.gguf")])
def test_a_backend_with_the_model_in_the_process_refuses_workers(argv):
    said = refusal(*argv, "--workers", "2")
    assert said.startswith("--workers is for --backend vllm and replay:") and "each worker would load" in said
    assert refusal(*argv) is None and refusal(*argv, "--workers", "1") is None


def test_relays_take_workers_given_a_port_and_their_servers():
    assert refusal("--backend", "replay", "--replay", "steps.jsonl", "--workers", "4") is None
    assert refusal("--backend", "vllm", "--vllm-url", "http://gpu:8000", "--workers", "2") is None
    assert "--port" in refusal("--backend", "vllm", "--vllm-url", "http://gpu:8000", "--workers", "2", "--port", "0")
    assert "--vllm-url" in refusal("--backend", "vllm", "some/model", "--workers", "2")
    assert "at least 1" in refusal("--backend", "replay", "--replay", "f", "--workers", "0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def supervisor(port: int) -> workers.Supervisor:
    settings = settings_from(build_parser().parse_args(
        ["serve", "--backend", "replay", "--replay", "f", "--workers", "2", "--port", str(port)]))
    return workers.Supervisor(settings, [])


def test_a_port_in_use_is_refused_even_by_workers_that_share_theirs():
    port = free_port()
    supervisor(port)._check_port()  # free
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        with pytest.raises(SystemExit, match=f"127.0.0.1:{port} is in use"):
            supervisor(port)._check_port()
    # Another looptrace's workers listen with SO_REUSEPORT, which ours would share unnoticed.
    with socket.socket() as worker:
        worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        worker.bind(("127.0.0.1", port))
        worker.listen()
        with pytest.raises(SystemExit, match="is in use"):
            supervisor(port)._check_port()


# -- metrics of several workers --


@pytest.fixture
def multiprocess(tmp_path, monkeypatch):
    """`as_worker(pid)`: metrics made and written inside it go to that pid's files, as in a worker
    process (prometheus_client picks its value class when imported, from PROMETHEUS_MULTIPROC_DIR)."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    classes: dict[int, type] = {}

    @contextlib.contextmanager
    def as_worker(pid: int):
        cls = classes.setdefault(pid, values.MultiProcessValue(lambda: pid))
        monkeypatch.setattr(values, "ValueClass", cls)
        yield
        monkeypatch.setattr(values, "ValueClass", values.MutexValue)

    made: list[Metrics] = []
    yield as_worker, tmp_path, made
    for m in made:
        m.close()


def scrape(m: Metrics) -> dict[str, list]:
    body, content_type = m.exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def one(samples: dict[str, list], name: str, **labels) -> object:
    matching = [s for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, (name, labels, matching)
    return matching[0]


def test_any_worker_answers_with_every_workers_sum_once(multiprocess, monkeypatch):
    as_worker, folder, made = multiprocess
    monkeypatch.setattr(metrics_module, "SAMPLE_SECONDS", 3600)  # sampled when scraped, in this test
    running = {101: 2, 102: 5}
    for pid, requests, ttft, trace in ((101, 3, 0.02, "aa" * 16), (102, 4, 0.3, "bb" * 16)):
        with as_worker(pid):
            m = Metrics()
            made.append(m)
            m.requests.labels("m", "chat", "200").inc(requests)
            m.ttft.labels("m", "chat").observe(ttft, {"trace_id": trace})
            m.watch("m", lambda pid=pid: running[pid], lambda: 1)
            m._sample()
    a, b = made
    with as_worker(101):
        samples = scrape(a)
    assert one(samples, "looptrace_requests_total", model="m", status="200").value == 7
    assert one(samples, "looptrace_time_to_first_token_seconds_count", model="m").value == 2
    assert one(samples, "looptrace_requests_running", model="m").value == 7  # livesum
    assert one(samples, "looptrace_requests_waiting", model="m").value == 2
    assert not any("pid" in s.labels for found in samples.values() for s in found)
    # The answering worker's own exemplar, on the bucket its observation fell in; none of the other's.
    exemplars = {s.labels["le"]: s.exemplar for s in samples["looptrace_time_to_first_token_seconds_bucket"]
                 if s.exemplar is not None}
    assert {e.labels["trace_id"] for e in exemplars.values()} == {"aa" * 16}
    assert float(min(exemplars, key=float)) >= 0.02 and exemplars[min(exemplars, key=float)].value == 0.02

    running[101] = 0  # worker 101's gauge as of its last sample, once it samples again
    mark_process_dead(102, str(folder))  # as the supervisor does when a worker dies
    with as_worker(101):
        samples = scrape(a)
    assert one(samples, "looptrace_requests_running", model="m").value == 0  # its gauges leave the sum
    assert one(samples, "looptrace_requests_total", model="m", status="200").value == 7  # its counts stay


def test_a_group_of_gaps_at_once_counts_as_each_in_a_worker(multiprocess):
    import random

    as_worker, _, made = multiprocess
    rng = random.Random(3)
    gaps = [rng.choice([rng.uniform(0, 3), *ITL_BUCKETS]) for _ in range(300)]
    with as_worker(201):
        one_by_one = Metrics()
        made.append(one_by_one)
        for gap in gaps:
            one_by_one.itl.labels("x").observe(gap)
    with as_worker(202):
        grouped = Metrics()
        made.append(grouped)
        observe_all(grouped.itl.labels("y"), gaps)
        samples = scrape(grouped)
    for le in ("0.001", "0.05", "1.0", "+Inf"):
        x = one(samples, "looptrace_inter_token_latency_seconds_bucket", model="x", le=le).value
        assert one(samples, "looptrace_inter_token_latency_seconds_bucket", model="y", le=le).value == x
    assert one(samples, "looptrace_inter_token_latency_seconds_count", model="y").value == len(gaps)
