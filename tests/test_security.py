"""Kafka security on the real broker, and no secret in a running stack's logs, health files or ``litstream status``.

Two Apache Kafka nodes (KRaft, broker and controller combined) are started here, each shared by the module:
* SASL: a ``SASL_PLAINTEXT`` listener offering SCRAM-SHA-256 and SCRAM-SHA-512, with two users created when the
  log dir is formatted (``kafka-storage format --add-scram``): ``admin`` (SHA-256), whom the broker logs in as to
  itself on the same listener, and ``agent`` (SHA-512), whom litstream's clients log in as. The controller listener
  stays plaintext on loopback (a single node only talks to itself there).
* TLS: an ``SSL`` listener with a server certificate for 127.0.0.1 signed by a throwaway CA (``openssl``), given
  to Kafka as PEM files.

Checked: the LITSTREAM_KAFKA_* settings reach librdkafka's producer, consumer and admin client and Faust's
aiokafka client (``faust_broker_credentials``), and with them records go through; a client without a login, with a
wrong password, without the CA or in plaintext is refused within a bounded time; the whole stack (the lifecycle
processor on Faust, the span sink, the gateway, runners) works through the SASL broker and writes no secret.

The gateway's token (401 without it or with a wrong one, /health open) is tested in test_gateway.py; the settings
alone in test_security_settings.py.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from pydantic import SecretStr

from litstream.infra.broker import KafkaBroker, Listener, free_port
from litstream.infra.kafka import admin, consumer, producer
from litstream.infra.settings import Settings
from litstream.streams.lifecycle import faust_broker_credentials
from tests.waiting import until

ADMIN, ADMIN_PASSWORD = "admin", "broker-Pw-25b0"  # the broker's own login (inter-broker)
AGENT, SASL_PASSWORD = "agent", "kafka-Pw-7d1e"  # litstream's login
SCRAM_ENV = {"LITSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "LITSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
             "LITSTREAM_KAFKA_SASL_USERNAME": AGENT, "LITSTREAM_KAFKA_SASL_PASSWORD": SASL_PASSWORD}
REFUSAL_WAIT_S = 5.0  # how long a refused client is watched: nothing of it may get through meanwhile
HEAP_MB = 256  # each test broker's heap: both run at once, while this module's tests run


# --- Brokers --------------------------------------------------------------------------------------------------------

def safe_cluster_id() -> str:
    """A KRaft cluster id that does not begin with "-": the storage tool would read ``-t -xyz`` as an option."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def scram_listener() -> Listener:
    """SASL_PLAINTEXT with both SCRAM mechanisms. Each mechanism a listener enables needs a JAAS entry; the login
    in it is the one the broker uses for its own connections to the listener (it is the inter-broker one)."""
    jaas = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{ADMIN}" password="{ADMIN_PASSWORD}";')
    return Listener("SASL_PLAINTEXT", {
        "listener.name.{listener}.sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.{listener}.scram-sha-256.sasl.jaas.config": jaas,
        "listener.name.{listener}.scram-sha-512.sasl.jaas.config": jaas,
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
    })


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    root = tmp_path_factory.mktemp("sasl-broker")
    users = [f"SCRAM-SHA-256=[name={ADMIN},password={ADMIN_PASSWORD}]",
             f"SCRAM-SHA-512=[name={AGENT},password={SASL_PASSWORD}]"]
    broker = KafkaBroker(root / "log", log_path=root / "broker.log", cluster=safe_cluster_id(), heap_mb=HEAP_MB,
                         listener=scram_listener(), format_args=[a for u in users for a in ("--add-scram", u)],
                         client_config={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                                        "sasl.username": ADMIN, "sasl.password": ADMIN_PASSWORD})
    with broker:
        yield broker


def make_certificates(where: Path) -> tuple[Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it (P-256 keys: fast to make). Returns the
    CA's certificate and the broker's PEM keystore (its PKCS#8 key, then its certificate)."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True, timeout=60)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=litstream test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", *key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (where / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
                                      "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                                      "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-extfile", "server.ext", "-out", "server.pem")
    keystore = where / "keystore.pem"
    keystore.write_text((where / "server.key").read_text() + (where / "server.pem").read_text())
    return where / "ca.pem", keystore


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaBroker, Path]]:
    """The TLS broker and the CA that signed its certificate."""
    root = tmp_path_factory.mktemp("tls-broker")
    ca, keystore = make_certificates(tmp_path_factory.mktemp("certs"))
    # The truststore is for the broker's connections to its own listener (inter-broker, TLS too).
    listener = Listener("SSL", {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore),
                                "ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca)})
    broker = KafkaBroker(root / "log", log_path=root / "broker.log", cluster=safe_cluster_id(), heap_mb=HEAP_MB,
                         listener=listener, client_config={"security.protocol": "SSL", "ssl.ca.location": str(ca)})
    with broker:
        yield broker, ca


def scram_settings(broker: KafkaBroker, password: str = SASL_PASSWORD, **more: Any) -> Settings:
    return Settings(bootstrap_servers=broker.bootstrap, kafka_security_protocol="SASL_PLAINTEXT",
                    kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username=AGENT,
                    kafka_sasl_password=SecretStr(password), **more)


def tls_settings(broker: KafkaBroker, ca: Path | None) -> Settings:
    return Settings(bootstrap_servers=broker.bootstrap, kafka_security_protocol="SSL",
                    kafka_ssl_cafile=str(ca) if ca else None)


# --- Clients --------------------------------------------------------------------------------------------------------

def new_topic(settings: Settings) -> str:
    name = f"security-{uuid.uuid4().hex[:8]}"
    client = admin(settings)  # kept alive until the futures resolve
    for fut in client.create_topics([NewTopic(name, 1, 1)], request_timeout=15).values():
        fut.result()
    return name


def produce(settings: Settings, topic: str, value: bytes, timeout: float = 30.0) -> KafkaError | None:
    """Produce one record with litstream's producer; its delivery error (None: written) within ``timeout``."""
    outcome: list[KafkaError | None] = []
    client = producer(settings, log_level=0, error_cb=lambda _e: None, **{"message.timeout.ms": int(timeout * 1000)})
    client.produce(topic, value, on_delivery=lambda err, _msg: outcome.append(err))
    client.flush(timeout + 10)
    assert outcome, "no delivery report"
    return outcome[0]


def consume(settings: Settings, topic: str, timeout: float = 30.0) -> tuple[list[bytes], list[str]]:
    """The values litstream's consumer reads from ``topic`` (partition 0, from the start) within ``timeout``, and
    the errors its client reported meanwhile. Returns as soon as a value is read."""
    errors: list[str] = []
    client = consumer(settings, group_id=f"security-{uuid.uuid4().hex[:6]}", log_level=0,
                      error_cb=lambda err: errors.append(str(err)))
    values: list[bytes] = []
    try:
        client.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while not values and time.monotonic() < deadline:
            msg = client.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
    finally:
        client.close()
    return values, errors


def client_errors(kind: str, settings: Settings) -> list[str]:
    """What librdkafka reports to a producer's or consumer's error callback while it tries to connect (bounded)."""
    seen: list[str] = []

    def on_error(err: KafkaError) -> None:
        seen.append(str(err))

    client: Any = (producer(settings, error_cb=on_error, log_level=0) if kind == "producer" else
                   consumer(settings, group_id="security-test", error_cb=on_error, log_level=0))
    try:
        deadline = time.monotonic() + REFUSAL_WAIT_S
        while not seen and time.monotonic() < deadline:
            client.poll(0.1)
    finally:
        if kind == "consumer":
            client.close()
    return seen


async def faust_client_produces(settings: Settings, topic: str, value: bytes) -> None:
    """Write one record with aiokafka configured exactly as a Faust app's producer is from these settings."""
    credentials = faust_broker_credentials(settings).get("broker_credentials")
    client = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, request_timeout_ms=10_000,
                              **credentials_to_aiokafka_auth(credentials))
    await asyncio.wait_for(client.start(), 20)
    try:
        await asyncio.wait_for(client.send_and_wait(topic, value), 20)
    finally:
        await client.stop()


def faust_client_refusal(settings: Settings, caplog: pytest.LogCaptureFixture) -> str:
    """Why aiokafka, configured as Faust's producer is, could not connect: it logs the cause and then raises
    KafkaConnectionError ("Unable to bootstrap"), within the bounded time of faust_client_produces."""
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(KafkaConnectionError):
        asyncio.run(faust_client_produces(settings, "any-topic", b"x"))
    return caplog.text


# --- SASL -----------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sasl_topic(sasl_broker: KafkaBroker) -> str:
    """A topic on the SASL broker with one record in it."""
    settings = scram_settings(sasl_broker)
    topic = new_topic(settings)
    assert produce(settings, topic, b"first") is None
    return topic


@pytest.mark.parametrize("kind", ["producer", "consumer"])
def test_scram_settings_from_the_environment_log_in(sasl_broker: KafkaBroker, sasl_topic: str, kind: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in SCRAM_ENV.items():
        monkeypatch.setenv(key, value)
    settings = Settings(bootstrap_servers=sasl_broker.bootstrap)
    if kind == "producer":
        assert produce(settings, sasl_topic, b"from-env") is None
    else:
        values, _ = consume(settings, sasl_topic)
        assert values[:1] == [b"first"]


@pytest.mark.parametrize("kind", ["producer", "consumer"])
def test_a_client_without_sasl_is_refused(sasl_broker: KafkaBroker, sasl_topic: str, kind: str) -> None:
    plain = Settings(bootstrap_servers=sasl_broker.bootstrap)
    errors = client_errors(kind, plain)
    # The broker closes the connection on the first request that is not a SASL handshake: no SASL exchange.
    assert errors and not any("SASL" in e for e in errors), errors
    if kind == "producer":
        err = produce(plain, sasl_topic, b"unauthenticated", timeout=REFUSAL_WAIT_S)
        assert err is not None and err.code() == KafkaError._MSG_TIMED_OUT, err
    else:
        values, errors = consume(plain, sasl_topic, timeout=REFUSAL_WAIT_S)
        assert values == [] and errors


def test_a_wrong_password_is_refused_and_not_echoed(sasl_broker: KafkaBroker) -> None:
    wrong = "not-the-Pw-0000"
    errors = client_errors("producer", scram_settings(sasl_broker, password=wrong))
    assert any("Authentication failed" in e and "SCRAM-SHA-512" in e for e in errors), errors
    assert not any(wrong in e or SASL_PASSWORD in e for e in errors)


def test_admin_needs_a_login(sasl_broker: KafkaBroker) -> None:
    with pytest.raises(KafkaException):
        admin(Settings(bootstrap_servers=sasl_broker.bootstrap)).list_topics(timeout=3)
    meta = admin(scram_settings(sasl_broker)).list_topics(timeout=10)
    assert list(meta.brokers) == [1]


def test_faust_client_logs_in_with_scram(sasl_broker: KafkaBroker, sasl_topic: str) -> None:
    settings = scram_settings(sasl_broker)
    asyncio.run(faust_client_produces(settings, sasl_topic, b"from-faust"))
    topic = new_topic(settings)  # a topic of its own, so the record read back is Faust's
    asyncio.run(faust_client_produces(settings, topic, b"from-faust"))
    assert consume(settings, topic)[0] == [b"from-faust"]


def test_faust_client_with_a_wrong_password_is_refused(sasl_broker: KafkaBroker,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    wrong = "not-the-Pw-0000"
    said = faust_client_refusal(scram_settings(sasl_broker, password=wrong), caplog)
    assert "SaslAuthenticationFailed" in said and "invalid credentials" in said, said
    assert wrong not in said


# --- TLS ------------------------------------------------------------------------------------------------------------

def test_tls_with_the_ca_produces_and_consumes(tls_broker: tuple[KafkaBroker, Path]) -> None:
    broker, ca = tls_broker
    settings = tls_settings(broker, ca)
    topic = new_topic(settings)
    assert produce(settings, topic, b"over-tls") is None
    assert consume(settings, topic)[0] == [b"over-tls"]


def test_faust_client_over_tls_with_the_ca(tls_broker: tuple[KafkaBroker, Path]) -> None:
    broker, ca = tls_broker
    settings = tls_settings(broker, ca)
    topic = new_topic(settings)
    asyncio.run(faust_client_produces(settings, topic, b"faust-over-tls"))
    assert consume(settings, topic)[0] == [b"faust-over-tls"]


def test_tls_without_the_ca_is_refused(tls_broker: tuple[KafkaBroker, Path], caplog: pytest.LogCaptureFixture) -> None:
    broker, _ = tls_broker
    errors = client_errors("producer", tls_settings(broker, None))  # the system's CAs only
    assert any("certificate verify failed" in e for e in errors), errors
    with pytest.raises(KafkaException):
        admin(tls_settings(broker, None)).list_topics(timeout=3)
    said = faust_client_refusal(tls_settings(broker, None), caplog)
    assert "CERTIFICATE_VERIFY_FAILED" in said, said


def test_a_plaintext_client_is_refused_by_the_tls_listener(tls_broker: tuple[KafkaBroker, Path]) -> None:
    broker, _ = tls_broker
    with pytest.raises(KafkaException):
        admin(Settings(bootstrap_servers=broker.bootstrap)).list_topics(timeout=3)
    assert client_errors("producer", Settings(bootstrap_servers=broker.bootstrap))


# --- The stack ------------------------------------------------------------------------------------------------------

def test_loopback_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("LITSTREAM_GATEWAY_HOST", "LITSTREAM_BOOTSTRAP_SERVERS", "LITSTREAM_POLICY_SERVER_HOST"):
        monkeypatch.delenv(key, raising=False)
    settings = Settings()
    assert settings.gateway_host == "127.0.0.1" and settings.bootstrap_servers.startswith("127.0.0.1:")
    assert settings.policy_server_host == "127.0.0.1"
    broker = KafkaBroker()
    try:
        assert broker.bootstrap.startswith("127.0.0.1:")
        assert broker.server_properties()["listeners"].count("127.0.0.1:") == 2  # client and controller
    finally:
        broker.stop()  # removes its throwaway log dir


def test_stack_through_sasl_leaks_no_secret(sasl_broker: KafkaBroker, tmp_path: Path) -> None:
    """A stack logged in with SCRAM (the lifecycle processor on Faust, the span sink, the gateway and runners on
    librdkafka) finishes rollouts through the SASL broker; its SASL password, gateway token and ClickHouse
    password appear in no process's log, health file, the stack file, the broker's log or `litstream status`."""
    from litstream.app.stack import Stack, settings_env
    from litstream.infra import health
    from litstream.infra.kafka import create_topics
    from litstream.infra.producer import EventProducer
    from litstream.workers.client import enqueue_rollout

    token, ch_password = "gw-Tok-93f2", "ch-Pw-41aa"
    secrets = (SASL_PASSWORD, token, ch_password)
    data = tmp_path / "data"
    settings = scram_settings(sasl_broker, data_dir=data, topic_prefix=f"sec{uuid.uuid4().hex[:6]}",
                              gateway_token=SecretStr(token))
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
        until("three rollouts succeeded through the SASL broker",
              lambda: (health.read(data, "runner") or {}).get("succeeded", 0) >= 3, timeout=120)
        env = {**settings_env(settings),
               "LITSTREAM_CLICKHOUSE_DSN": f"http://bob:{ch_password}@127.0.0.1:{free_port()}/db"}
        status = subprocess.run([sys.executable, "-m", "litstream.app.cli", "status"], check=False,
                                capture_output=True, text=True, timeout=120, env={**_env_without_litstream(), **env})
    assert "clickhouse" in status.stdout and "bob" not in status.stdout, status.stdout
    assert "down" not in _row(status.stdout, "broker"), status.stdout  # status logged in too
    texts = {"status": status.stdout + status.stderr}
    for path in [*data.rglob("*.log"), *data.rglob("*.json"), Path(str(sasl_broker.log_path))]:
        if path.is_file() and "chdb" not in path.parts:
            texts[str(path)] = path.read_text(errors="replace")
    assert any(p.endswith("runner.log") for p in texts) and any(p.endswith("gateway.log") for p in texts), list(texts)
    leaks = {where: [s for s in secrets if s in text] for where, text in texts.items()}
    assert not any(leaks.values()), {k: v for k, v in leaks.items() if v}


def _row(table: str, part: str) -> str:
    return next((line for line in table.splitlines() if f" {part} " in line), "")


def _env_without_litstream() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("LITSTREAM_")}
