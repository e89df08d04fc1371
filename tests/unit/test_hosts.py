"""The Host names the server answers (api/hosts.py, issue 55): a request sent to another name, as a page
on another site sends one after rebinding its DNS name to 127.0.0.1, reads nothing, on any route."""

from __future__ import annotations

import http.client
import json

import pytest

from looptrace.proxy import cli
from looptrace.proxy.settings import Settings

from app_thread import AppThread

ROUTES = ["/v1/sessions", "/v1/traces", "/v1/models", "/", "/health", "/metrics"]


def sent_to(app: AppThread, path: str, host: str | None) -> tuple[int, bytes]:
    """GET `path` with `host` as the Host header (None: none at all), as a browser would send it."""
    connection = http.client.HTTPConnection("127.0.0.1", int(app.url.rpartition(":")[2]), timeout=30)
    try:
        connection.putrequest("GET", path, skip_host=True)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.fixture(scope="module")
def app(qwen3_5_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hosts")
    (folder / "none.jsonl").write_text('{"text": "unused"}\n')
    running = AppThread(Settings(model=str(qwen3_5_dir), backend="replay", replay=str(folder / "none.jsonl"),
                                 served_model_name="tiny", trace_db=str(folder / "traces.sqlite3"),
                                 allowed_hosts=["gateway.internal"])).start()
    yield running
    running.stop()


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "localhost.evil",
                                  "gateway.internal.evil.example"])
def test_another_name_reads_nothing(app, path, host):
    status, body = sent_to(app, path, host)
    assert status == 403, (status, body[:200])
    error = json.loads(body)["error"]
    assert error["code"] == "host_not_allowed" and "--allowed-host" in error["message"], error
    assert host.split(":")[0] not in body.decode()  # the client's text is not echoed


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "127.0.0.1", "localhost:8000", "LOCALHOST", "viewer.localhost:8000",
                                  "[::1]:8000", "10.1.2.3:8000", "gateway.internal", "Gateway.Internal.:8000"])
def test_addresses_loopback_names_and_the_allowed_ones_are_answered(app, host):
    status, body = sent_to(app, "/v1/sessions", host)
    assert status == 200, (status, body[:200])


def test_allowed_host_is_an_option_that_repeats():
    args = cli.build_parser().parse_args(["serve", "m", "--allowed-host", "a.example", "--allowed-host", "b.example"])
    assert cli.settings_from(args).allowed_hosts == ["a.example", "b.example"]
    assert cli.settings_from(cli.build_parser().parse_args(["serve", "m"])).allowed_hosts == []
