"""The production monitoring files agree with the code: the Grafana dashboard queries only metrics the processes
define, Prometheus scrapes every long-running role on the port compose gives them, and compose runs both."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "infra" / "grafana" / "dashboards" / "litstream.json"
PROMETHEUS = ROOT / "infra" / "prometheus" / "prometheus.yml"
ROLES = {"lifecycle", "span-sink", "triplets", "trainer", "runner", "gateway"}
SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def defined_metric_names() -> set[str]:
    """Every "litstream_..." string literal in the source folders (metric names are written out in full)."""
    names: set[str] = set()
    for folder in ("infra", "streams", "trainer", "workers"):
        for path in (ROOT / folder).rglob("*.py"):
            names.update(re.findall(r'"(litstream_[a-z_]+)"', path.read_text()))
    return names


def base_name(series: str) -> str:
    for suffix in SUFFIXES:
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series


def test_grafana_dashboard_queries_defined_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    used = {base_name(m) for e in exprs for m in re.findall(r"litstream_[a-z_]+", e)}
    assert used - defined_metric_names() == set()
    for wanted in ("litstream_rollouts", "litstream_queue_depth", "litstream_consumer_lag", "litstream_events",
                   "litstream_spans", "litstream_sink_batch_size", "litstream_sink_batch_seconds",
                   "litstream_dead_letters", "litstream_attempt_timeouts", "litstream_retries",
                   "litstream_trainer_step_seconds", "litstream_trainer_tokens_per_second",
                   "litstream_policy_version", "litstream_trainer_reward_mean"):
        assert wanted in used, f"the Grafana dashboard does not show {wanted}"


def test_prometheus_scrapes_every_role_on_the_compose_port() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == ROLES
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    port = int(compose["services"]["lifecycle"]["environment"]["LITSTREAM_METRICS_PORT"])
    for name, job in jobs.items():
        assert job["dns_sd_configs"][0]["names"] == [name] and job["dns_sd_configs"][0]["port"] == port
        assert name in compose["services"], f"Prometheus scrapes {name}, which compose does not run"
    assert {"prometheus", "grafana"} <= set(compose["services"])
