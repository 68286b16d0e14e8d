"""Settings every Kafka client shares, whichever library builds it (confluent-kafka or Faust's aiokafka):
security, and the group session that decides how soon a silent member's partitions move on."""

from __future__ import annotations

from typing import Any

from .settings import Settings


def security_config(settings: Settings) -> dict[str, Any]:
    """librdkafka security settings from the environment (empty for PLAINTEXT)."""
    conf: dict[str, Any] = {}
    if settings.kafka_security_protocol != "PLAINTEXT":
        conf["security.protocol"] = settings.kafka_security_protocol
    if settings.kafka_sasl_mechanism:
        conf["sasl.mechanism"] = settings.kafka_sasl_mechanism
    if settings.kafka_sasl_username:
        conf["sasl.username"] = settings.kafka_sasl_username
    if settings.kafka_sasl_password:
        conf["sasl.password"] = settings.kafka_sasl_password.get_secret_value()
    if settings.kafka_ssl_cafile:
        conf["ssl.ca.location"] = settings.kafka_ssl_cafile
    return conf


def heartbeat_ms(settings: Settings) -> int:
    """A third of the session, as Kafka advises, so two missed beats never cost a member its place."""
    return max(100, settings.session_timeout_ms // 3)


def group_config(settings: Settings) -> dict[str, Any]:
    """librdkafka's group session settings."""
    return {"session.timeout.ms": settings.session_timeout_ms, "heartbeat.interval.ms": heartbeat_ms(settings)}


def faust_group_config(settings: Settings) -> dict[str, Any]:
    """The same for a Faust app (seconds)."""
    return {"broker_session_timeout": settings.session_timeout_ms / 1000,
            "broker_heartbeat_interval": heartbeat_ms(settings) / 1000}
