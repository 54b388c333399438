"""What a Grafana dashboard asks Prometheus for, and what a /metrics page offers, as metric names.

Queries are parsed with a real PromQL parser (`promql-parser`, the Rust one GreptimeDB uses)
after Grafana's own variables are replaced by values Prometheus would see.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "turnout.json"

# Grafana's built-in interval variables, as durations PromQL accepts.
_INTERVALS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
# `label_values(selector, label)`: a Grafana query function around a series selector.
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*\w+\)$")
# The samples a family of each type has, beside the family name itself.
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets and the series selectors of query variables."""
    found = [t["expr"] for p in panels(dashboard) for t in p.get("targets", []) if t.get("expr")]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            match = _LABEL_VALUES.match(text.strip())
            found.append(match["selector"] if match else text)
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects. A selector without a name is refused: it cannot be checked."""
    for variable, value in _INTERVALS.items():
        expr = expr.replace(variable, value)
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            equal = promql_parser.MatchOp.Equal
            by_label = (m.value for m in node.matchers.matchers if m.name == "__name__" and m.op == equal)
            name = node.name or next(by_label, None)
            if not name:
                raise ValueError(f"a selector without a metric name in {expr!r}")
            names.add(name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def exposed_names(page: str) -> set[str]:
    """The series names a /metrics page offers: each sample's, and each family's by its type's
    suffixes (a family with no samples yet, e.g. a counter by reason before any, still counts)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(page):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return names
