"""grafana/: the provisioned datasources and the looptrace dashboard work the first time.

No Grafana runs here, so what Grafana would do with them is done by hand: every datasource a panel
names is provisioned; every PromQL expression, with the dashboard's variables substituted, passes
`promtool check rules`; and in a real Prometheus (Debian's) that has scraped a real looptrace
after a few requests, tool calls included, every looptrace expression returns a series and the
exemplar queries return trace ids that are in looptrace's trace store. The dashboard's Tempo
searches can't run without Tempo; the span attributes they filter and show are checked on the
stored traces instead.

vLLM's own series (`vllm:` metrics, the vLLM row) can't exist here: vLLM needs a GPU. Those
expressions are checked by promtool, and their metric names against the source of the vLLM release
compose/compose.yaml pins, but are left out of the "returns a series" check. So are looptrace's
per-server series (`looptrace_upstream_`), which need vLLM servers behind it: the test of several
servers (test_vllm_pool.py) checks those panels in a real Prometheus instead.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

import packaged

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
DATASOURCES = ROOT / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
MODEL = "qwen"
CONVERSATION = "conv-dashboards-1"
# Grafana's variables, as the test sets them: a concrete model and ranges Prometheus accepts.
VARIABLES = {"model": MODEL, "conversation": CONVERSATION, "__rate_interval": "1m", "__interval": "15s",
             "__range": "10m"}
EXEMPLAR_LABEL = "trace_id"  # the label looptrace's histogram exemplars carry (proxy/request_trace.py)
VLLM_ROW = "vLLM engine"  # the title of the row of vLLM's own series starts so
VLLM_IMAGE = re.compile(r"vllm/vllm-openai:v(\d+\.\d+\.\d+)")
# Where vLLM's Prometheus metrics are defined, in the wheel of the pinned release.
VLLM_METRIC_FILES = ("vllm/v1/metrics/loggers.py", "vllm/v1/spec_decode/metrics.py")


def substitute(text: str) -> str:
    for name in sorted(VARIABLES, key=len, reverse=True):
        text = text.replace("${%s}" % name, VARIABLES[name]).replace("$" + name, VARIABLES[name])
    assert "$" not in text, f"a variable left unsubstituted in {text!r}"
    return text


def walk_panels(panels: list[dict], row: str = ""):
    """(panel, title of the row it sits under), rows' nested panels included."""
    for panel in panels:
        if panel.get("type") == "row":
            row = panel.get("title", "")
            yield from walk_panels(panel.get("panels", []), row)
            continue
        yield panel, row


def promql_targets(dashboard: dict) -> list[dict]:
    """Each Prometheus query of the dashboard: its expression (substituted), panel, row, exemplar flag."""
    found = []
    for panel, row in walk_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            source = target.get("datasource") or panel.get("datasource") or {}
            if source.get("type") == "prometheus":
                found.append({"expr": substitute(target["expr"]), "panel": panel["title"], "row": row,
                              "exemplar": bool(target.get("exemplar"))})
    return found


def is_vllm(expr: str) -> bool:
    return "vllm:" in expr


def is_upstream(expr: str) -> bool:
    """looptrace's per-server series exist only in front of vLLM servers: tests/test_vllm_pool.py checks
    those panels against a real Prometheus scraping looptrace in front of three vLLM doubles."""
    return "looptrace_upstream_" in expr


def traces_to_metrics_queries(datasources: list[dict]) -> list[str]:
    """Tempo's trace-to-metrics queries as Grafana runs them: `$$` is a literal `$` in provisioning,
    and `$__tags` becomes the span's attributes mapped to metric labels."""
    tempo = next(s for s in datasources if s["type"] == "tempo")
    links = tempo["jsonData"]["tracesToMetrics"]
    tags = ",".join(f'{t.get("value") or t["key"]}="{MODEL}"' for t in links["tags"])
    return [q["query"].replace("$$", "$").replace("$__tags", tags) for q in links["queries"]]


@pytest.fixture(scope="module")
def dashboards() -> list[dict]:
    assert DASHBOARDS, "no dashboard in grafana/dashboards"
    return [json.loads(path.read_text()) for path in DASHBOARDS]


@pytest.fixture(scope="module")
def datasources() -> list[dict]:
    return yaml.safe_load(DATASOURCES.read_text())["datasources"]


@pytest.fixture(scope="module")
def expressions(dashboards, datasources) -> list[dict]:
    found = [t for d in dashboards for t in promql_targets(d)]
    found += [{"expr": q, "panel": "Tempo: traces to metrics", "row": "", "exemplar": False}
              for q in traces_to_metrics_queries(datasources)]
    return found


# ---------------------------------------------------------------------------------------------
# The files themselves
# ---------------------------------------------------------------------------------------------


def test_dashboard_loads_and_its_panels_fit_the_grid(dashboards):
    for dashboard in dashboards:
        assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 41
        panels = [p for p, _ in walk_panels(dashboard["panels"])] + \
            [p for p in dashboard["panels"] if p["type"] == "row"]
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)), "panel ids repeat"
        boxes = []
        for panel in panels:
            g = panel["gridPos"]
            assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, panel["title"]
            for other, o in boxes:  # Grafana would shove overlapping panels around
                overlap = g["x"] < o["x"] + o["w"] and o["x"] < g["x"] + g["w"] and \
                    g["y"] < o["y"] + o["h"] and o["y"] < g["y"] + g["h"]
                assert not overlap, (panel["title"], other)
            boxes.append((panel["title"], g))


def test_model_variable_lists_the_models_looptrace_serves(dashboards, datasources):
    prometheus = next(s for s in datasources if s["type"] == "prometheus")
    for dashboard in dashboards:
        variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "model")
        assert variable["datasource"] == {"type": "prometheus", "uid": prometheus["uid"]}
        assert variable["definition"] == variable["query"]["query"] == "label_values(looptrace_requests_total, model)"


def test_every_datasource_a_dashboard_uses_is_provisioned(dashboards, datasources):
    provisioned = {s["uid"]: s["type"] for s in datasources}

    def references(node):
        if isinstance(node, dict):
            source = node.get("datasource")
            if isinstance(source, dict) and source.get("uid") != "-- Grafana --":
                yield source
            for value in node.values():
                yield from references(value)
        elif isinstance(node, list):
            for value in node:
                yield from references(value)

    used = [source for dashboard in dashboards for source in references(dashboard)]
    assert {s["type"] for s in used} == {"prometheus", "tempo"}
    for source in used:
        assert provisioned.get(source["uid"]) == source["type"], f"{source} is not provisioned"


def test_datasources_link_exemplars_and_traces_to_each_other(datasources):
    by_type = {s["type"]: s for s in datasources}
    prometheus, tempo = by_type["prometheus"], by_type["tempo"]
    destinations = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    # An exemplar opens its trace in Tempo, or in looptrace's viewer.
    assert [(d["name"], d.get("datasourceUid")) for d in destinations] == [(EXEMPLAR_LABEL, tempo["uid"]),
                                                                           (EXEMPLAR_LABEL, None)]
    assert destinations[1]["url"].startswith("${LOOPTRACE_VIEWER_URL}/")
    assert tempo["jsonData"]["search"]["hide"] is False
    links = tempo["jsonData"]["tracesToMetrics"]
    assert links["datasourceUid"] == prometheus["uid"] and links["queries"]
    assert {t["key"] for t in links["tags"]} == {"gen_ai.request.model"}


def test_latency_panels_show_exemplars(dashboards):
    latency = re.compile(r"looptrace_(time_to_first_token|inter_token_latency)_seconds_bucket")
    targets = [(panel, target) for d in dashboards for panel, _ in walk_panels(d["panels"])
               for target in panel.get("targets", []) if latency.search(target.get("expr", ""))]
    assert len(targets) >= 6  # p50, p95 and p99 of both
    for panel, target in targets:
        assert target.get("exemplar") is True, panel["title"]


def test_vllm_queries_are_only_in_the_vllm_row(expressions):
    # The one exemption from the live check below is for vLLM's series, and only in its row.
    vllm = [e for e in expressions if is_vllm(e["expr"])]
    assert vllm, "the vLLM row has no vllm: series"
    for e in vllm:
        assert e["row"].startswith(VLLM_ROW), e


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
            time.sleep(1.2)
        yield server, prometheus
    finally:
        prometheus.stop()


@pytest.mark.integration
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


@pytest.mark.integration
def test_model_variable_finds_the_served_model(scraped):
    server, prometheus = scraped
    body = prometheus._get("/api/v1/label/model/values", **{"match[]": "looptrace_requests_total"})
    assert body["data"] == [MODEL]


@pytest.mark.integration
def test_exemplars_lead_to_stored_traces(scraped, expressions):
    server, prometheus = scraped
    with_exemplars = [e for e in expressions if e["exemplar"] and not is_upstream(e["expr"])]
    assert any("time_to_first_token" in e["expr"] for e in with_exemplars)
    for e in with_exemplars:
        deadline = time.monotonic() + 30
        found: list = []
        while not found and time.monotonic() < deadline:
            found = prometheus.exemplars(e["expr"])
            time.sleep(0.5)
        trace_ids = {x["labels"][EXEMPLAR_LABEL] for series in found for x in series["exemplars"]}
        assert trace_ids, f"no exemplars for {e['panel']}: {e['expr']}"
        for trace_id in trace_ids:
            status, body = server.get(f"/v1/traces/{trace_id}")
            assert status == 200 and body["spans"][0]["trace_id"] == trace_id, (e["panel"], trace_id, body)


@pytest.mark.integration
def test_trace_searches_filter_on_attributes_the_spans_carry(scraped, dashboards):
    # Tempo can't run here; what its TraceQL needs from the spans can be checked in the store.
    server, _ = scraped
    deadline = time.monotonic() + 15  # spans are written in batches, off the request path
    while True:
        status, listing = server.get(f"/v1/traces?conversation={CONVERSATION}")
        if len(listing.get("data", [])) == 3 * ROUNDS or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert status == 200 and len(listing["data"]) == 3 * ROUNDS
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


def viewer_links(dashboards: list[dict], datasources: list[dict]) -> list[tuple[str, str, str]]:
    """(where, URL template, what its value is: "trace" or "conversation") for every link into the
    viewer: the dashboard's links and data links, the exemplar destination, Tempo's correlation."""
    found = []
    for dashboard in dashboards:
        for link in dashboard.get("links", []):
            found.append(("dashboard link", link["url"], "none"))
        for panel, _ in walk_panels(dashboard["panels"]):
            for link in panel.get("links", []):
                found.append((panel["title"], link["url"], "conversation"))
            for override in panel.get("fieldConfig", {}).get("overrides", []):
                field = override["matcher"]["options"]
                for prop in override["properties"]:
                    if prop["id"] == "links":
                        kind = "trace" if field == "traceID" else "conversation"
                        found += [(f"{panel['title']}: {field}", link["url"], kind) for link in prop["value"]]
    by_type = {s["type"]: s for s in datasources}
    for destination in by_type["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]:
        if "url" in destination:
            found.append(("exemplar", destination["url"].replace("$$", "$"), "trace"))
    for correlation in by_type["tempo"].get("correlations", []):
        assert correlation["type"] == "external" and correlation["config"]["field"] == "traceID"
        found.append(("Tempo span view", correlation["config"]["target"]["url"].replace("$$", "$"), "trace"))
    return found


def resolve(template: str, base: str, trace_id: str, conversation: str, kind: str) -> str:
    value = {"trace": trace_id, "conversation": conversation}.get(kind, "")
    url = template.replace("${viewer}", base).replace("${LOOPTRACE_VIEWER_URL}", base)
    for name in ("${__value.raw:percentencode}", "${conversation:percentencode}"):
        url = url.replace(name, urllib.parse.quote(value, safe=""))
    url = url.replace("${__value.raw}", value).replace("${traceID}", value)
    assert "$" not in url, f"a variable left unsubstituted in {template!r}"
    return url


def test_every_viewer_link_is_there(dashboards, datasources):
    where = {w for w, _, _ in viewer_links(dashboards, datasources)}
    assert {"dashboard link", "exemplar", "Tempo span view", "Recent traces of $model: traceID",
            "Recent traces of $model: gen_ai.conversation.id", "Traces of conversation $conversation"} <= where


@pytest.mark.integration
def test_every_link_into_the_viewer_opens_that_trace_or_session(scraped, dashboards, datasources):
    """Each link, its variables set as Grafana would, is a page looptrace serves, and in a real browser
    it opens what the link promises: the trace's step, or the session."""
    from browser import Page, chromium

    server, _ = scraped
    deadline = time.monotonic() + 15
    while True:
        status, listing = server.get(f"/v1/traces?conversation={CONVERSATION}")
        if listing.get("data") or time.monotonic() > deadline:
            break
        time.sleep(0.3)
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
