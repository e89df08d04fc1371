"""grafana/ against the programs that read it: no Grafana runs here, so what Grafana would do with the
provisioned datasources and the looptrace dashboard is done by hand. Every PromQL expression, with the
dashboard's variables substituted, passes `promtool check rules`; and in a real Prometheus (Debian's)
that has scraped a real looptrace after a few requests, tool calls included, every looptrace expression
returns a series and the exemplar queries return trace ids that are in looptrace's trace store. The
dashboard's Tempo searches can't run without Tempo; the span attributes they filter and show are checked
on the stored traces instead. Every link into the trace viewer opens, in Chromium, what it promises.

vLLM's own series (`vllm:` metrics, the vLLM row) can't exist here: vLLM needs a GPU. Those
expressions are checked by promtool, and their metric names against the source of the vLLM release
compose/compose.yaml pins, but are left out of the "returns a series" check. So are looptrace's
per-server series (`looptrace_upstream_`), which need vLLM servers behind it: the test of several
servers (test_vllm_pool.py) checks those panels in a real Prometheus instead. What is read without
programs is in tests/unit/test_dashboards.py.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

import packaged
from grafana_dashboards import (
    CONVERSATION,
    EXEMPLAR_LABEL,
    MODEL,
    ROOT,
    all_expressions,
    is_upstream,
    is_vllm,
    load_dashboards,
    load_datasources,
    resolve,
    substitute,
    viewer_links,
    walk_panels,
)
from waiting import wait_until

VLLM_IMAGE = re.compile(r"vllm/vllm-openai:v(\d+\.\d+\.\d+)")
# Where vLLM's Prometheus metrics are defined, in the wheel of the pinned release.
VLLM_METRIC_FILES = ("vllm/v1/metrics/loggers.py", "vllm/v1/spec_decode/metrics.py")


@pytest.fixture(scope="module")
def dashboards() -> list[dict]:
    return load_dashboards()


@pytest.fixture(scope="module")
def datasources() -> list[dict]:
    return load_datasources()


@pytest.fixture(scope="module")
def expressions(dashboards, datasources) -> list[dict]:
    return all_expressions(dashboards, datasources)


# ---------------------------------------------------------------------------------------------
# PromQL, by promtool
# ---------------------------------------------------------------------------------------------


def promtool_check(expressions: list[str], workdir: Path) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: `apt-get install prometheus` (Debian) — tests/run.sh does it")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(expressions)]}]}
    path = workdir / "rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


def test_every_query_passes_promtool(expressions, tmp_path):
    done = promtool_check([e["expr"] for e in expressions], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(expressions)} rules found" in done.stdout


def test_promtool_rejects_a_broken_query(tmp_path):
    done = promtool_check(["sum(rate(looptrace_requests_total[1m])"], tmp_path)  # one parenthesis short
    assert done.returncode != 0


# ---------------------------------------------------------------------------------------------
# vLLM's metric names, from the source of the pinned release
# ---------------------------------------------------------------------------------------------


def _vllm_version() -> str:
    match = VLLM_IMAGE.search((ROOT / "compose" / "compose.yaml").read_text())
    assert match, "compose/compose.yaml pins no vllm/vllm-openai image"
    return match.group(1)


@pytest.fixture(scope="module")
def vllm_metric_families() -> set[str]:
    """Every `vllm:` metric name the pinned vLLM defines (string literals in its metrics modules)."""
    version = _vllm_version()
    folder = packaged.vllm_sources("vllm-metrics", version, VLLM_METRIC_FILES)
    names = set()
    for name in VLLM_METRIC_FILES:
        for node in ast.walk(ast.parse((folder / name).read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    re.fullmatch(r"vllm:[a-z0-9_]+", node.value):
                names.add(node.value)
    assert "vllm:num_requests_running" in names, "no metric names found: has vLLM moved them?"
    return names


def test_vllm_series_exist_in_the_pinned_vllm(expressions, vllm_metric_families):
    used = {name for e in expressions for name in re.findall(r"vllm:[a-z0-9_]+", e["expr"])}
    assert used
    for name in sorted(used):
        family = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert family in vllm_metric_families, f"{name}: vLLM {_vllm_version()} has no metric {family}"


# ---------------------------------------------------------------------------------------------
# A real Prometheus scraping a real looptrace
# ---------------------------------------------------------------------------------------------

CALL = ("\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>")


CALL_UNKNOWN = ("\n</think>\n\n<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n"
                "</function>\n</tool_call><|im_end|>")


ANSWER = "It is sunny.\n</think>\n\nSunny in Paris.<|im_end|>"


ROUNDS = 3


STEPS = [CALL, ANSWER, CALL_UNKNOWN] * ROUNDS


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def scraped(serve, qwen3_5_dir, tmp_path_factory):
    """looptrace (replayed answers: valid and unknown tool calls, text) scraped by Prometheus."""
    from openai import OpenAI

    from prometheus import Prometheus

    workdir = tmp_path_factory.mktemp("dashboards")
    replay = workdir / "steps.jsonl"
    replay.write_text("".join(json.dumps({"text": s}) + "\n" for s in STEPS))
    server = serve(str(qwen3_5_dir), "--backend", "replay", "--replay", str(replay), "--served-model-name", MODEL)
    prometheus = Prometheus([f"127.0.0.1:{server.port}"], workdir)
    try:
        prometheus.wait_ready()
        prometheus.wait_scraped()
        client = OpenAI(base_url=server.base_url, api_key="unused")
        session = {"session_id": CONVERSATION}  # pi's header: the conversation id of the spans
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        for _ in range(ROUNDS):  # requests between scrapes, so rate() sees counters move
            client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], extra_headers=session)
            list(client.chat.completions.create(model=MODEL, messages=ask, stream=True, extra_headers=session))
            client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], extra_headers=session)
            prometheus.wait_next_scrape()
        yield server, prometheus
    finally:
        prometheus.stop()


def test_every_looptrace_query_returns_a_series(scraped, expressions):
    server, prometheus = scraped
    checked = [e for e in expressions if not is_vllm(e["expr"]) and not is_upstream(e["expr"])]
    assert len(checked) > len(expressions) // 2
    empty = [e for e in checked if not prometheus.wait_for(e["expr"], timeout=30)]
    assert not empty, f"no series for {[(e['panel'], e['expr']) for e in empty]}"
    # Not only series, but the numbers the requests made.
    def value(expr: str) -> dict[str, float]:
        return {json.dumps(s["metric"], sort_keys=True): float(s["value"][1]) for s in prometheus.query(expr)}
    tools = {json.loads(k)["outcome"]: v for k, v in value(
        f'sum by (outcome) (increase(looptrace_tool_calls_total{{model="{MODEL}"}}[10m]))').items()}
    assert set(tools) == {"valid", "unknown_tool"} and all(v > 0 for v in tools.values())
    statuses = value(substitute('sum by (status) (rate(looptrace_requests_total{model="$model"}[$__rate_interval]))'))
    assert [json.loads(k)["status"] for k in statuses] == ["200"] and all(v > 0 for v in statuses.values())


def test_model_variable_finds_the_served_model(scraped):
    server, prometheus = scraped
    body = prometheus._get("/api/v1/label/model/values", **{"match[]": "looptrace_requests_total"})
    assert body["data"] == [MODEL]


def test_exemplars_lead_to_stored_traces(scraped, expressions):
    server, prometheus = scraped
    with_exemplars = [e for e in expressions if e["exemplar"] and not is_upstream(e["expr"])]
    assert any("time_to_first_token" in e["expr"] for e in with_exemplars)
    for e in with_exemplars:
        found = wait_until(lambda: prometheus.exemplars(e["expr"]), 30, every=0.5, or_last=True)
        trace_ids = {x["labels"][EXEMPLAR_LABEL] for series in found for x in series["exemplars"]}
        assert trace_ids, f"no exemplars for {e['panel']}: {e['expr']}"
        for trace_id in trace_ids:
            status, body = server.get(f"/v1/traces/{trace_id}")
            assert status == 200 and body["spans"][0]["trace_id"] == trace_id, (e["panel"], trace_id, body)


def test_trace_searches_filter_on_attributes_the_spans_carry(scraped, dashboards):
    # Tempo can't run here; what its TraceQL needs from the spans can be checked in the store.
    server, _ = scraped
    # Spans are written in batches, off the request path.
    listing = wait_until(lambda: _traces(server, lambda data: len(data) == 3 * ROUNDS), 15, every=0.3)
    status, trace = server.get(f"/v1/traces/{listing['data'][0]['trace_id']}")
    root = next(s for s in trace["spans"] if s["parent_span_id"] is None)
    assert root["attributes"]["gen_ai.request.model"] == MODEL
    assert root["attributes"]["gen_ai.conversation.id"] == CONVERSATION
    searches = [t["query"] for d in dashboards for p, _ in walk_panels(d["panels"]) for t in p.get("targets", [])
                if (t.get("datasource") or {}).get("type") == "tempo"]
    assert len(searches) == 2
    for search in searches:
        attributes = re.findall(r"span\.([A-Za-z0-9_.]+)", search)
        assert attributes
        for attribute in attributes:
            assert attribute in root["attributes"], f"{search}: the server span has no {attribute}"
        for attribute, value in re.findall(r'span\.([A-Za-z0-9_.]+) = "([^"]*)"', substitute(search)):
            assert root["attributes"][attribute] == value, search


# ---------------------------------------------------------------------------------------------
# Links into looptrace's trace viewer
# ---------------------------------------------------------------------------------------------


def test_every_link_into_the_viewer_opens_that_trace_or_session(scraped, dashboards, datasources):
    """Each link, its variables set as Grafana would, is a page looptrace serves, and in a real browser
    it opens what the link promises: the trace's step, or the session."""
    from browser import Page, chromium

    server, _ = scraped
    listing = wait_until(lambda: _traces(server, bool), 15, every=0.3)
    trace_id = listing["data"][0]["trace_id"]
    links = viewer_links(dashboards, datasources)
    with chromium() as browser:
        for where, template, kind in links:
            url = resolve(template, server.url, trace_id, CONVERSATION, kind)
            with urllib.request.urlopen(url, timeout=30) as response:
                page_html = response.read().decode()
                assert response.status == 200 and "<title>looptrace</title>" in page_html, (where, url)
            page = Page(browser)
            try:
                page.page.goto(url)
                if kind == "trace":
                    page.page.locator(f'li.step[data-step="{trace_id}"]').wait_for(timeout=15_000)
                elif kind == "conversation":
                    page.page.locator("li.step").first.wait_for(timeout=15_000)
                    assert CONVERSATION in page.page.inner_text(".session-head"), where
                else:
                    page.page.locator("a.session").first.wait_for(timeout=15_000)
                assert page.errors == [], (where, page.errors)
            finally:
                page.close()


def _traces(server, enough) -> dict | None:
    """The conversation's trace listing, once `enough(its rows)`."""
    status, listing = server.get(f"/v1/traces?conversation={CONVERSATION}")
    return listing if status == 200 and enough(listing.get("data", [])) else None
