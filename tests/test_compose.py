"""Static checks of the production docker-compose.yml (no Docker engine needed)."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("yaml")
pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"


def _load_checker() -> ModuleType:
    # Loaded by path so the test works whether or not the package is installed.
    spec = importlib.util.spec_from_file_location("compose_check", ROOT / "infra" / "compose_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


cc = _load_checker()


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    doc: dict[str, Any] = cc.load_compose(COMPOSE_FILE)
    return doc


def test_repo_compose_file_passes(stack: dict[str, Any]) -> None:
    assert cc.check_document(stack) == []


def test_anchors_are_resolved(stack: dict[str, Any]) -> None:
    services = stack["services"]
    assert services["span-sink"]["depends_on"]["clickhouse"] == {"condition": "service_healthy"}
    assert services["span-sink"]["depends_on"]["topics"] == {"condition": "service_completed_successfully"}
    assert services["gateway"]["environment"]["LITSTREAM_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert services["topics"]["restart"] == "no"
    # Scalable roles: nothing that would clash between replicas.
    for name in ("lifecycle", "span-sink", "runner"):
        assert "container_name" not in services[name] and "ports" not in services[name]


def test_main_reports_ok(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc, "docker_compose_config", lambda path: None)  # no external binary
    assert cc.main([str(COMPOSE_FILE)]) == 0
    assert capsys.readouterr().out.startswith("OK ")


def test_broken_stack_reports_each_problem(stack: dict[str, Any]) -> None:
    doc = copy.deepcopy(stack)
    services = doc["services"]
    services["zookeeper"] = {"image": "zookeeper:3.9", "healthcheck": services["kafka"]["healthcheck"]}
    services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] = "broker"
    del services["lifecycle"]["healthcheck"]
    services["gateway"]["ports"] = ["0.0.0.0:8080:8080"]
    services["runner"]["image"] = "someone-else:latest"
    services["topics"]["restart"] = "always"

    problems = cc.check_rules(doc)
    text = "\n".join(problems)
    assert "zookeeper: ZooKeeper is not used" in text
    assert "kafka: KAFKA_PROCESS_ROLES must contain broker and controller" in text
    assert "lifecycle: long-running service has no healthcheck" in text
    assert "gateway: port '0.0.0.0:8080:8080' is published on all interfaces" in text
    assert "litstream services must all use one image" in text
    assert "topics: one-shot service must use restart" in text
    assert len(problems) == 6


@pytest.mark.parametrize(
    ("port", "ok"),
    [
        ("127.0.0.1:8080:8080", True),
        ("[::1]:8080:8080/tcp", True),
        ({"target": 8080, "published": 8080, "host_ip": "127.0.0.1"}, True),
        ("8080:8080", False),
        ("8080", False),
        (8080, False),
        ("0.0.0.0:8080:8080", False),
        ({"target": 8080, "published": 8080}, False),
    ],
)
def test_port_bindings(port: Any, ok: bool) -> None:
    assert (cc._check_ports("svc", {"ports": [port]}) == []) is ok


def test_minimal_negative_document() -> None:
    doc = {
        "version": "3.9",
        "services": {
            "zookeeper": {"image": "bitnami/zookeeper:3.9", "ports": ["2181:2181"]},
            "kafka": {
                "image": "bitnami/kafka:3.7",
                "environment": ["KAFKA_ZOOKEEPER_CONNECT=zookeeper:2181"],
            },
        },
    }
    text = "\n".join(cc.check_rules(doc))
    for expected in (
        "top-level 'version' is obsolete",
        "missing service 'clickhouse'",
        "zookeeper: ZooKeeper is not used",
        "kafka: image must be apache/kafka",
        "kafka: KAFKA_PROCESS_ROLES must contain broker and controller",
        "zookeeper: long-running service has no healthcheck",
        "zookeeper: port '2181:2181' is published on all interfaces",
    ):
        assert expected in text


def test_schema_rejects_unknown_keys(stack: dict[str, Any]) -> None:
    doc = copy.deepcopy(stack)
    doc["services"]["kafka"]["imagee"] = "typo"
    doc["services"]["gateway"]["healthcheck"]["retries"] = ["many"]
    problems = cc.validate_schema(doc)
    assert any(p.startswith("schema: services.kafka:") and "imagee" in p for p in problems)
    assert any(p.startswith("schema: services.gateway.healthcheck.retries:") for p in problems)
