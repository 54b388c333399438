"""The compose `monitoring` profile (Prometheus + Grafana) and the files it mounts, checked offline:
they parse, and each points at what the other side really serves (ports, paths, names).
The dashboard's queries against a live stack: tests/e2e/test_stack_metrics.py."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway import metrics as gateway_metrics
from tests.grafana_queries import load_dashboard, metric_names, panels, queries
from tests.test_deploy import COMPOSE_FILE, DEPLOY, load_compose

MONITORING = ("prometheus", "grafana")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def mounts(service: dict[str, Any]) -> dict[PurePosixPath, Path]:
    """Bind mounts of a compose service: container path -> the file or folder on the host."""
    found = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            found[PurePosixPath(target)] = (COMPOSE_FILE.parent / source).resolve()
    return found


def flag(command: list[str], name: str) -> str:
    return next(arg.split("=", 1)[1] for arg in command if arg.startswith(f"{name}="))


def test_monitoring_services_run_only_in_their_profile(compose: dict[str, Any]) -> None:
    for name in MONITORING:
        assert compose["services"][name]["profiles"] == ["monitoring"]
    # The Turnout stack itself starts without the profile.
    for name in ("engine", "tokenizer", "router", "gateway"):
        assert "profiles" not in compose["services"][name]


def test_every_mounted_file_is_in_the_repository(compose: dict[str, Any]) -> None:
    for name in MONITORING:
        for target, source in mounts(compose["services"][name]).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) is missing"
            assert DEPLOY in source.parents


def test_prometheus_scrapes_the_gateway_metrics_page(compose: dict[str, Any]) -> None:
    prometheus = compose["services"]["prometheus"]
    config_path = PurePosixPath(flag(prometheus["command"], "--config.file"))
    config = yaml.safe_load(mounts(prometheus)[config_path].read_text())

    (job,) = config["scrape_configs"]
    (static,) = job["static_configs"]
    (target,) = static["targets"]
    host, port = target.rsplit(":", 1)
    gateway = compose["services"]["gateway"]["command"]
    assert host == "gateway"
    assert port == gateway[gateway.index("--port") + 1]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert "/metrics" in {route.path for route in gateway_metrics.router.routes}  # type: ignore[attr-defined]

    # The gateway answers within its own deadline on the router, even when a service hangs; Prometheus
    # must wait at least that long, and (its rule) no longer than its interval.
    seconds = {k: float(config["global"][k].removesuffix("s")) for k in ("scrape_interval", "scrape_timeout")}
    assert gateway_metrics.ROUTER_SCRAPE_TIMEOUT_S < seconds["scrape_timeout"] <= seconds["scrape_interval"]


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard(compose: dict[str, Any]) -> None:
    grafana, prometheus = compose["services"]["grafana"], compose["services"]["prometheus"]
    files = mounts(grafana)
    provisioning = files[PurePosixPath("/etc/grafana/provisioning")]

    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    url = urlsplit(datasource["url"])
    assert datasource["type"] == "prometheus"
    assert url.hostname == "prometheus"
    assert f":{url.port}" == flag(prometheus["command"], "--web.listen-address")

    (provider,) = yaml.safe_load((provisioning / "dashboards" / "turnout.yml").read_text())["providers"]
    folder = PurePosixPath(provider["options"]["path"])
    dashboards = [source for target, source in files.items() if target.parent == folder]
    assert dashboards == [DEPLOY / "grafana" / "turnout.json"]
    home = PurePosixPath(grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert home.parent == folder and files[home] == dashboards[0]


def test_dashboard_is_well_formed() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "turnout"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    # Every expression is PromQL (once Grafana's variables are in) and names its metrics.
    for expr in queries(dashboard):
        assert metric_names(expr), expr


def test_dashboard_covers_what_operators_look_at() -> None:
    names = set().union(*(metric_names(q) for q in queries(load_dashboard())))
    for needed in (
        "vllm:request_success_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_hits_total",
        "turnout_router_routing_decisions_total",
    ):
        assert needed in names


def test_a_broken_query_is_caught() -> None:
    with pytest.raises(ValueError):
        metric_names("sum(rate(vllm:generation_tokens_total[$__rate_interval])")  # unbalanced
    with pytest.raises(ValueError):
        metric_names('{job="turnout"}')  # no metric name: nothing to check it against
