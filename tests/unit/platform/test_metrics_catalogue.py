"""The metric catalogue, the Grafana dashboard and the operating guide agree: nothing queried that rayfleet does not define."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rayfleet.platform._metrics import METRICS

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deployments" / "grafana" / "rayfleet-dashboard.json"
SERIES = re.compile(r"\bray_rayfleet_[a-z_]+")


def _exported() -> set[str]:
    return {name for info in METRICS for name in info.exported_names}


def _expressions(dashboard: dict[str, object]) -> list[str]:
    panels = dashboard["panels"]
    assert isinstance(panels, list)
    return [target["expr"] for panel in panels for target in panel["targets"]]


def test_every_metric_is_named_rayfleet_and_declared_once() -> None:
    names = [info.name for info in METRICS]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"rayfleet_[a-z_]+", name) for name in names)
    assert {info.kind for info in METRICS} == {"counter", "gauge", "histogram"}
    assert all(info.source in {"host", "ledger", "engine"} and info.description for info in METRICS)


def test_the_dashboard_parses_and_queries_only_rayfleet_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {item["name"]: item for item in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    queried = {series for expression in _expressions(dashboard) for series in SERIES.findall(expression)}
    queried |= {series for item in variables.values() for series in SERIES.findall(str(item.get("definition", "")))}
    assert queried <= _exported(), sorted(queried - _exported())
    # And every metric is on the dashboard somewhere.
    assert {info.name for info in METRICS if set(info.exported_names) & queried} == {info.name for info in METRICS}


def test_the_operating_guide_documents_every_metric() -> None:
    guide = (ROOT / "docs" / "guides" / "operating.md").read_text()
    missing = [info.name for info in METRICS if f"`{info.name}`" not in guide]
    assert missing == []
