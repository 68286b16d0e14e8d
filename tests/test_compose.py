"""Static checks of the production docker-compose.yml (no Docker engine needed)."""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("yaml")
pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
KAFKA_NODES = ("kafka", "kafka-2", "kafka-3")  # the cluster profile's; "kafka" alone without it
REPLICATION_KEYS = ("KAFKA_DEFAULT_REPLICATION_FACTOR", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
                    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                    "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR")
MIN_ISR_KEYS = ("KAFKA_MIN_INSYNC_REPLICAS", "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
                "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR")


def _load_checker() -> ModuleType:
    # Loaded by path so the test works whether or not the package is installed.
    spec = importlib.util.spec_from_file_location("compose_check", ROOT / "tools" / "compose_check.py")
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
    assert interpolate(services["gateway"]["environment"]["LITSTREAM_BOOTSTRAP_SERVERS"], {}) == "kafka:9092"
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


# --- Kafka: the embedded broker's version, one node or the cluster profile's three -------------------------


def interpolate(value: object, env: Mapping[str, str]) -> str:
    """Compose's ``${VAR}`` and ``${VAR:-default}`` (the forms this file uses) resolved against ``env``."""
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: env.get(m[1]) or (m[2] or ""), str(value))


def documented_cluster_env() -> dict[str, str]:
    """The variables the file's header says select the cluster layout."""
    found = re.findall(r"^#\s+(COMPOSE_PROFILES|KAFKA_CLUSTER_\w+)=(\S+)$", COMPOSE_FILE.read_text(), re.MULTILINE)
    return dict(found)


def kafka_env(stack: dict[str, Any], name: str, env: Mapping[str, str]) -> dict[str, str]:
    return {k: interpolate(v, env) for k, v in cc._environment(stack["services"][name]).items()}


def test_kafka_is_the_embedded_brokers_version(stack: dict[str, Any]) -> None:
    from litstream.infra.broker import KAFKA_VERSION

    images = {n: s["image"] for n, s in stack["services"].items() if cc._image_is(s, "apache/kafka")}
    assert set(images) == set(KAFKA_NODES)
    assert set(images.values()) == {f"apache/kafka:{KAFKA_VERSION}"}


def test_without_the_cluster_variables_kafka_is_one_node(stack: dict[str, Any]) -> None:
    env = kafka_env(stack, "kafka", {})
    assert "profiles" not in stack["services"]["kafka"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    assert {env[k] for k in REPLICATION_KEYS + MIN_ISR_KEYS} == {"1"}


def test_cluster_profile_is_three_kraft_nodes_at_replication_3(stack: dict[str, Any]) -> None:
    cluster = documented_cluster_env()
    assert cluster["COMPOSE_PROFILES"] == "cluster"
    services = stack["services"]
    assert [services[n].get("profiles") for n in KAFKA_NODES] == [None, ["cluster"], ["cluster"]]
    envs = {n: kafka_env(stack, n, cluster) for n in KAFKA_NODES}
    voters = ",".join(f"{envs[n]['KAFKA_NODE_ID']}@{services[n]['hostname']}:9093" for n in KAFKA_NODES)
    assert voters == "1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093"
    for name, env in envs.items():
        assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}, name
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == voters, name
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092", name
        assert {env[k] for k in REPLICATION_KEYS} == {"3"} and {env[k] for k in MIN_ISR_KEYS} == {"2"}, name
    assert len({env["CLUSTER_ID"] for env in envs.values()}) == 1
    assert len({services[n]["volumes"][0].split(":")[0] for n in KAFKA_NODES}) == 3  # a log dir each
    # Topics are created once all three brokers answer (replication 3 needs them), only with the profile.
    depends = services["topics"]["depends_on"]
    assert all(depends[n] == {"condition": "service_healthy", "required": False} for n in KAFKA_NODES[1:])
    bootstrap = interpolate(services["lifecycle"]["environment"]["LITSTREAM_BOOTSTRAP_SERVERS"], cluster)
    assert bootstrap == "kafka:9092,kafka-2:9092,kafka-3:9092"


def test_cluster_profile_matches_the_embedded_cluster(stack: dict[str, Any]) -> None:
    """The broker defaults of the three-node ``KafkaCluster`` (the fault test's) are the compose cluster's."""
    from litstream.infra.broker import replicated_defaults

    env = kafka_env(stack, "kafka-2", documented_cluster_env())
    expected = {f"KAFKA_{k.upper().replace('.', '_')}": v for k, v in replicated_defaults(3).items()
                if not k.endswith("num.partitions")}
    assert {k: env.get(k) for k in expected} == expected
