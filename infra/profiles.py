"""Client settings per broker profile.

The embedded broker (Tansu) has measured defects (see docs/embedded-stack.md, "Kafka: Tansu"): slow first
group joins and a ListOffsets that does not return the log end. Its workarounds live here, so the code paths that
build clients stay the same against Apache Kafka.
"""

from __future__ import annotations

from typing import Any

from .log_storage import MIN_SESSION_TIMEOUT_MS
from .settings import Settings

# The embedded broker: the first group join waits a delay that grows with the session timeout
# (`local_session_timeout_ms`: 3 s at 6000, 2 s at 3000), so that timeout is short and heartbeats frequent; a fetch is not answered early when data arrives (it waits out fetch.wait.max.ms,
# `local_fetch_wait_ms`), so that wait is kept short. (Faust's fetch wait and changelog ends are corrected in
# streams/faust_patches.py.)
_LOCAL_HEARTBEAT_MS = 500
_PRODUCTION_FAUST: dict[str, Any] = {"broker_session_timeout": 10.0, "broker_heartbeat_interval": 3.0}


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


def local_session_timeout_ms(settings: Settings) -> int:
    """The group session timeout on the embedded broker: the durable log (noida-db) refuses one under 6 s, as
    Apache Kafka's group.min.session.timeout.ms does, so every client of it asks for at least that."""
    if settings.broker_storage == "durable":
        return max(settings.local_session_timeout_ms, MIN_SESSION_TIMEOUT_MS)
    return settings.local_session_timeout_ms


def consumer_profile(settings: Settings) -> dict[str, Any]:
    if settings.profile != "local":
        return {}
    return {"session.timeout.ms": local_session_timeout_ms(settings), "heartbeat.interval.ms": _LOCAL_HEARTBEAT_MS,
            "fetch.wait.max.ms": settings.local_fetch_wait_ms}


def faust_profile(settings: Settings) -> dict[str, Any]:
    if settings.profile != "local":
        return dict(_PRODUCTION_FAUST)
    return {"broker_session_timeout": local_session_timeout_ms(settings) / 1000,
            "broker_heartbeat_interval": _LOCAL_HEARTBEAT_MS / 1000}

