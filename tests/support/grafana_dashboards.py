"""grafana/ read as Grafana reads it, for the dashboard tests (tests/unit/test_dashboards.py,
tests/integration/test_dashboards_prometheus.py) and the several-servers test (tests/integration/test_vllm_pool_processes.py):
the provisioned dashboards and datasources, their PromQL with Grafana's variables set, the links into
looptrace's trace viewer.
"""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
DATASOURCES = ROOT / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
MODEL = "qwen"
CONVERSATION = "conv-dashboards-1"
# Grafana's variables, as the test sets them: a concrete model and ranges Prometheus accepts.
VARIABLES = {"model": MODEL, "conversation": CONVERSATION, "__rate_interval": "1m", "__interval": "15s",
             "__range": "10m"}
EXEMPLAR_LABEL = "trace_id"  # the label looptrace's histogram exemplars carry (proxy/observe/metrics.py)


def load_dashboards() -> list[dict]:
    assert DASHBOARDS, "no dashboard in grafana/dashboards"
    return [json.loads(path.read_text()) for path in DASHBOARDS]


def load_datasources() -> list[dict]:
    return yaml.safe_load(DATASOURCES.read_text())["datasources"]


def all_expressions(dashboards: list[dict], datasources: list[dict]) -> list[dict]:
    """Every PromQL query Grafana would run: the dashboards' panels and Tempo's traces-to-metrics."""
    found = [t for d in dashboards for t in promql_targets(d)]
    found += [{"expr": q, "panel": "Tempo: traces to metrics", "row": "", "exemplar": False}
              for q in traces_to_metrics_queries(datasources)]
    return found


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
    """looptrace's per-server series exist only in front of vLLM servers: tests/integration/test_vllm_pool_processes.py checks
    those panels against a real Prometheus scraping looptrace in front of three vLLM doubles."""
    return "looptrace_upstream_" in expr


def traces_to_metrics_queries(datasources: list[dict]) -> list[str]:
    """Tempo's trace-to-metrics queries as Grafana runs them: `$$` is a literal `$` in provisioning,
    and `$__tags` becomes the span's attributes mapped to metric labels."""
    tempo = next(s for s in datasources if s["type"] == "tempo")
    links = tempo["jsonData"]["tracesToMetrics"]
    tags = ",".join(f'{t.get("value") or t["key"]}="{MODEL}"' for t in links["tags"])
    return [q["query"].replace("$$", "$").replace("$__tags", tags) for q in links["queries"]]


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
