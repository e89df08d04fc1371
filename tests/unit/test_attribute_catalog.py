"""One catalog of names (common/attributes.py): no module types a span attribute, event or metric name
of its own, and the manual's span and metric tables (docs/traces.md, docs/metrics.md) name exactly what
the catalog holds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from manual import page

from looptrace.common import attributes
from looptrace.proxy.observe.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("proxy", "trace_store", "backends", "families", "common")
CATALOG = ROOT / "common" / "attributes.py"

# The shapes the catalog's names take: an attribute or event (OpenTelemetry's namespaces, ours), a metric.
NAME = re.compile(r"^(gen_ai|looptrace|server|http|error|user_agent|url|openinference|llm|input|output)\.[a-z0-9_.]+$"
                  r"|^looptrace_[a-z_]+$")
# The manual's names are the same, a template's `{kind}` written `*`; or `.name`, short for the last full
# name's namespace with this last part (`gen_ai.request.model`, `.temperature`).
DOC_NAME = re.compile(r"^(gen_ai|looptrace|server|http|error|user_agent|url|openinference|llm|input|output)"
                      r"\.[a-z0-9_.*]+$")
# Named in the manual but not written by looptrace (none today).
NOT_OURS: set[str] = set()


def names_outside_catalog(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string in `source` shaped like a catalog name, f-strings' pieces included;
    a logger's name (`getLogger("looptrace.trace")`) is not one."""
    tree = ast.parse(source)
    loggers = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
               and getattr(node.func, "attr", getattr(node.func, "id", None)) == "getLogger" for arg in node.args}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value)
            and id(node) not in loggers]


def test_no_module_types_a_name_the_catalog_holds():
    # The check sees a name written at a call site, in an f-string too, and lets a logger's name be.
    assert names_outside_catalog('span.set_attribute("gen_ai.request.model", m)\nx = f"looptrace.prompt.{k}"\n'
                                 'log = logging.getLogger("looptrace.trace")\nc = Counter("looptrace_x", "")') \
        == [(1, "gen_ai.request.model"), (2, "looptrace.prompt."), (4, "looptrace_x")]
    typed = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path != CATALOG:
                typed += [f"{path.relative_to(ROOT)}:{line}: {name!r}"
                          for line, name in names_outside_catalog(path.read_text())]
    assert not typed, "import these names from looptrace.common.attributes:\n" + "\n".join(typed)


def documented_span_names() -> set[str]:
    """Every attribute and event name docs/traces.md gives, abbreviations spelled out."""
    names, last = set(), None
    for quoted in re.findall(r"`([^`\s]+)`", page("traces.md")):
        if DOC_NAME.match(quoted) and not quoted.endswith(".*"):  # `looptrace.*` is a namespace
            names.add(quoted)
            last = quoted
        elif quoted.startswith(".") and last and re.fullmatch(r"\.[a-z0-9_.*]+", quoted):
            names.add(last.rsplit(".", 1)[0] + quoted)
    return names


def catalog_span_names() -> set[str]:
    """The catalog's attribute and event names (a template's `{kind}` as `*`): all but span and metric
    names and the token columns' common prefix."""
    return {value.replace("{kind}", "*") for key, value in vars(attributes).items()
            if key.isupper() and isinstance(value, str) and not key.startswith(("SPAN_", "ENDPOINT_", "METRIC_"))
            and key != "TOKENS_PREFIX"}


def documented_metrics() -> set[str]:
    """The families of docs/metrics.md's table, as prometheus_client names them (a counter less `_total`)."""
    rows = re.findall(r"^\| `(looptrace_[a-z_]+)` \| (\w+) \|", page("metrics.md"), re.MULTILINE)
    return {name.removesuffix("_total") if kind == "counter" else name for name, kind in rows}


def test_the_manual_names_the_catalogs_attributes_and_metrics():
    in_docs, in_catalog = documented_span_names(), catalog_span_names()
    assert len(in_catalog) > 90 and attributes.GEN_AI_REQUEST_TOP_P in in_docs
    assert in_docs - NOT_OURS <= in_catalog, f"docs/traces.md names what nothing writes: {in_docs - NOT_OURS - in_catalog}"
    assert in_catalog <= in_docs, f"docs/traces.md lacks {in_catalog - in_docs}"

    metrics = {value for key, value in vars(attributes).items() if key.startswith("METRIC_")}
    assert metrics == {family.name for family in Metrics().registry.collect()}  # metrics.py serves them all
    assert documented_metrics() == metrics, (documented_metrics() - metrics, metrics - documented_metrics())


def test_the_route_receipt_has_one_vocabulary():
    # Every looptrace.route.* attribute is one row of ROUTE_RECEIPT, which the span writer and the step reader
    # both read; a receipt field is named as its attribute ends, and no two rows share a receipt field or step key.
    route = {value for key, value in vars(attributes).items() if key.startswith("ROUTE_") and isinstance(value, str)}
    rows = attributes.ROUTE_RECEIPT
    assert sorted(a for _, a, _ in rows) == sorted(route) and len(route) > 25
    assert all(field is None or attribute == f"looptrace.route.{field}" for field, attribute, _ in rows)
    for names in ([f for f, _, _ in rows if f], [k for _, _, k in rows if k]):
        assert len(names) == len(set(names))
