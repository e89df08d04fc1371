"""A real Prometheus (Debian's `prometheus`) scraping a test's looptrace, with exemplar storage on."""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path

import waiting
from processes import Service, answers_ok, free_port


class Prometheus(Service):
    name = "prometheus"

    def __init__(self, targets: list[str], workdir: Path, *, interval: str = "1s", extra_scrape: str = "") -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("Prometheus is not installed: `apt-get install prometheus` (Debian) — tests/run.sh does it")
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
            "scrape_configs:\n  - job_name: looptrace\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n" + extra_scrape
        )
        super().__init__([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                          f"--web.listen-address=127.0.0.1:{self.port}", "--enable-feature=exemplar-storage"],
                         workdir / "prometheus.log")
        self.url = f"http://127.0.0.1:{self.port}"

    def _get(self, path: str, **params) -> dict:
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(self.url + path + query, timeout=10) as response:
            return json.loads(response.read())

    def wait_ready(self, timeout: float = 60) -> None:
        self.wait_until(lambda: answers_ok(self.url + "/-/ready"), timeout)

    def query(self, promql: str) -> list[dict]:
        body = self._get("/api/v1/query", query=promql)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, promql: str, timeout: float = 60) -> list[dict]:
        """The query's result once it has at least one series (scrapes and rates need a few seconds), or
        the empty result at the deadline, for the caller to say what is missing."""
        return waiting.wait_until(lambda: self.query(promql), timeout, every=0.5, or_last=True)

    def exemplars(self, promql: str, seconds: float = 600) -> list[dict]:
        now = time.time()
        body = self._get("/api/v1/query_exemplars", query=promql, start=str(now - seconds), end=str(now + 60))
        assert body["status"] == "success", body
        return body["data"]

    def scraped(self) -> bool:
        return any(s["value"][1] == "1" for s in self.query('up{job="looptrace"}'))

    def wait_scraped(self, timeout: float = 30) -> None:
        """Until looptrace has been scraped once (or the time is up: the queries then say what is missing)."""
        waiting.wait_until(self.scraped, timeout, every=0.3, or_last=True)

    def wait_next_scrape(self, timeout: float = 30) -> None:
        """Until a scrape of looptrace newer than now is stored: what a test did before it is counted, and
        what it does next falls in a later scrape (rate() needs counters that moved between two)."""
        now = time.time()
        waiting.wait_until(lambda: any(float(s["value"][1]) > now for s in self.query('timestamp(up{job="looptrace"})')),
                           timeout, every=0.2, what="a scrape of looptrace after this moment")
