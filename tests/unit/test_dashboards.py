"""grafana/: the provisioned datasources and the looptrace dashboard work the first time, read here as
Grafana would read them: every datasource a panel names is provisioned, the panels fit the grid, the
latency panels show exemplars, the vLLM queries sit in the vLLM row, and every link into the trace
viewer is there. What needs programs (promtool, the pinned vLLM's wheel, a real Prometheus scraping a
real looptrace, the viewer in Chromium) is in tests/integration/test_dashboards_prometheus.py.
"""

from __future__ import annotations

import re

import pytest

from grafana_dashboards import (
    EXEMPLAR_LABEL,
    all_expressions,
    is_vllm,
    load_dashboards,
    load_datasources,
    viewer_links,
    walk_panels,
)

VLLM_ROW = "vLLM engine"  # the title of the row of vLLM's own series starts so


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
# A real Prometheus scraping a real looptrace
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# Links into looptrace's trace viewer
# ---------------------------------------------------------------------------------------------


def test_every_viewer_link_is_there(dashboards, datasources):
    where = {w for w, _, _ in viewer_links(dashboards, datasources)}
    assert {"dashboard link", "exemplar", "Tempo span view", "Recent traces of $model: traceID",
            "Recent traces of $model: gen_ai.conversation.id", "Traces of conversation $conversation"} <= where


