"""Settings from the environment (prefix ``LITSTREAM_``), shared by every process of the pipeline."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

PREFIX = "LITSTREAM_"
# Variables with the prefix that are not settings of the pipeline: read by tests, benchmarks and tools.
OTHER_VARIABLES = frozenset({"LITSTREAM_FAILPOINTS", "LITSTREAM_SLOW", "LITSTREAM_VLLM_PYTHON", "LITSTREAM_AGL_VENV",
                             "LITSTREAM_MODEL_CACHE", "LITSTREAM_POLICY_UPSTREAM_API_KEY",
                             "LITSTREAM_REQUIRE_BROWSER", "LITSTREAM_SCREENSHOTS",
                             "LITSTREAM_KAFKA_CLASSPATH", "LITSTREAM_PARENT_PID", "LITSTREAM_LEARNING_MATRIX",
                             "LITSTREAM_LEARNING_MATRIX_SMOLLM2", "LITSTREAM_SMOLLM2", "LITSTREAM_LONG_RUNS"})


class UnknownSettingError(ValueError):
    """A ``LITSTREAM_*`` variable that is no setting: most likely misspelled."""


def check_environment(env: Mapping[str, str], fields: list[str]) -> None:
    """Refuse ``LITSTREAM_*`` variables that name no setting, with the closest valid names and the full list."""
    valid = sorted(PREFIX + f.upper() for f in fields)
    unknown = sorted(k for k in env if k.upper().startswith(PREFIX) and k.upper() not in valid
                     and k.upper() not in OTHER_VARIABLES)
    if not unknown:
        return
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name.upper(), valid, n=1)
        lines.append(f"{name}" + (f" (did you mean {close[0]}?)" if close else ""))
    raise UnknownSettingError(f"unknown setting {', '.join(lines)}; unset it. Valid settings: {', '.join(valid)}")


class Settings(BaseSettings):
    """Where the pipeline's parts are and how to talk to them.

    The embedded broker and the production one are both Apache Kafka, so every client is built the same way
    against either (``infra/kafka.py``).
    """

    model_config = SettingsConfigDict(env_prefix="LITSTREAM_", extra="ignore")

    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = Field("litstream", pattern=r"^[A-Za-z0-9._-]+$")
    partitions: int = Field(4, ge=1, le=256)
    data_dir: Path = Path(".litstream")
    clickhouse_dsn: str | None = None  # default: chdb:///<data_dir>/chdb
    schema_registry_url: str | None = None
    producer_id: str | None = None  # default: <role>-<host>-<pid>
    # The training run this process works for (`Trainer.fit` / `litstream train` set it for their stack): every
    # rollout-scoped event it writes carries it (docs/history.md). None: no run.
    run_id: str | None = Field(None, pattern=r"^[A-Za-z0-9._:-]{1,100}$")
    # The consumer group session timeout of every client (librdkafka and Faust): a member silent that long is
    # dropped and its partitions go to the others, so it bounds how soon a killed worker's rollouts move on.
    session_timeout_ms: int = Field(10_000, ge=1000, le=300_000)
    # Where the embedded broker (`litstream up`, the demos, `Trainer.fit`'s stack) keeps its log: ``durable`` under
    # ``<data_dir>/kafka`` (every rollout, span and offset survives a stop, even a SIGKILL of the broker), or
    # ``ephemeral``: a throwaway directory removed when the stack stops (`litstream up --ephemeral`).
    broker_storage: Literal["durable", "ephemeral"] = "durable"
    # The embedded broker's JVM heap (fixed: -Xms = -Xmx); docs/embedded-stack.md has what it was measured with.
    broker_heap_mb: int = Field(384, ge=128, le=65_536)
    # Per-topic retention overrides in ms by role name ("spans", "rollout-offers", "triplets", "spans.dlq", ...),
    # applied when the topics are created; the defaults are in infra/topics.py. JSON in the environment.
    topic_retention_ms: dict[str, int] = Field(default_factory=dict)
    # Where the lifecycle processor keeps its table of rollout state: ``rocksdb`` on disk under ``data_dir``
    # (memory bounded by the store's caches, warm after a restart) or ``memory`` (every rollout held in RAM,
    # rebuilt from the changelog at each start). The changelog on Kafka is the durable copy either way.
    table_store: Literal["rocksdb", "memory"] = "rocksdb"
    # Finished rollouts the store's and the policy endpoint's replicas hold besides the unfinished ones (newest
    # first); the store reads older ones from ClickHouse's ``rollouts`` table. Bounds their memory.
    store_keep_finished: int = Field(5_000, ge=1)

    # Kafka security, passed to every client (confluent-kafka and Faust/aiokafka).
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: str | None = None

    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8080
    gateway_token: SecretStr | None = None
    # Origins a browser page may call the gateway from (CORS), comma-separated, or "*"; empty: CORS off.
    gateway_cors_origins: str = ""
    # A line per request in the gateway's log (aiohttp's access log). Off by default: at the agent loop's call
    # rates the lines cost the gateway a tenth of its CPU and fill its log.
    gateway_access_log: bool = False

    # The policy endpoint (`litstream policy-server`): where it listens, and the API key its callers must send
    # (``Authorization: Bearer <key>``, what OpenAI clients send as ``api_key``); none: no check.
    policy_server_host: str = "127.0.0.1"
    policy_server_port: int = Field(8090, ge=0, le=65535)
    policy_server_token: SecretStr | None = None

    # Each long-running process serves /metrics, /healthz and /readyz here (infra/metrics.py). Port 0 picks a
    # free one (recorded in the process's health beat), so the processes of one machine never collide; -1: off.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(0, ge=-1, le=65535)

    # Limits of each query a person sends (`litstream sql`, POST /v1/sql, `litstream report`).
    sql_max_seconds: float = Field(30.0, gt=0, le=3600)
    sql_max_memory_mb: int = Field(2048, ge=16)
    sql_max_rows: int = Field(100_000, ge=1)

    def __init__(self, **values: Any) -> None:
        check_environment(os.environ, list(type(self).model_fields))
        super().__init__(**values)

    @property
    def chdb_path(self) -> Path:
        return (self.data_dir / "chdb").resolve()

    @property
    def resolved_clickhouse_dsn(self) -> str:
        return self.clickhouse_dsn or f"chdb://{self.chdb_path}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
