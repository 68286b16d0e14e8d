"""The topic catalogue: every topic the pipeline uses, declared once.

Topics that carry per-rollout data share one partition count and the rollout id as key, so a rollout's
lifecycle events, spans, offers and state all live on the same partition number and one processor instance
owns all of a rollout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .settings import Settings

FOREVER = -1
HOUR_MS = 3600 * 1000
DAY_MS = 24 * HOUR_MS
# Kafka deletes (retention) and compacts only closed segments, and closes the active one at 64 MiB (the
# embedded broker's log.segment.bytes) or after segment.ms, 7 days by default: on a quiet stack a compacted
# topic would never be compacted and a day's retention would run a week late. So compacted topics close a
# segment every hour, and topics with a retention at least once a day (or once a retention, when shorter).
COMPACTED_SEGMENT_MS = HOUR_MS
RETAINED_SEGMENT_MS = DAY_MS


@dataclass(frozen=True)
class TopicSpec:
    """One topic: its role name, what keys it, and how long it keeps data."""

    name: str  # role name; the physical name is "<prefix>.<name>"
    key: str
    description: str
    cleanup: Literal["delete", "compact"] = "delete"
    retention_ms: int = FOREVER
    partitions: int | None = None  # None: the settings' partition count (co-partitioned by rollout id)
    dlq: bool = True
    extra_config: dict[str, str] = field(default_factory=dict)


# Retention (docs/durable-log.md): the lifecycle events and resources are the source of truth and kept forever, and
# so is each policy version's lineage (small: one record per version);
# spans are kept a week once copied into ClickHouse (the span sink's copy is the one queried); offers are dead once
# claimed, so a day; triplets a month (the trainer's input, replayable from the spans in ClickHouse after that).
# Rollout state is compacted (each record is a whole snapshot: the newest per rollout is all a reader needs).
# Workers are not: their records are observations that readers fold (streams/worker_fold.py), and compaction would
# keep only each worker's last one, dropping what earlier ones set (its last dequeue, busy time, heartbeat),
# so they are kept a week. Each retention can be changed per topic with LITSTREAM_TOPIC_RETENTION_MS, e.g.
# '{"spans": 86400000}', before the topics are created (`litstream topics create`, `litstream up`'s first
# start, the compose file's `topics` job); -1 keeps forever.
CATALOGUE: tuple[TopicSpec, ...] = (
    TopicSpec("rollout-events", "rollout_id", "Rollout and attempt lifecycle events: the source of truth."),
    TopicSpec("spans", "rollout_id", "Span-recorded events from agents (SDK, OpenTelemetry, OTLP).",
              retention_ms=7 * DAY_MS),
    TopicSpec("rollout-offers", "rollout_id", "Rollouts on offer to runners (queuing/requeuing).",
              retention_ms=DAY_MS),
    TopicSpec("rollout-state", "rollout_id", "Folded rollout snapshots, newest version wins.",
              cleanup="compact", dlq=False),
    TopicSpec("resources", "resources_id", "Resources-published events (policy versions, prompts).", partitions=1),
    TopicSpec("triplets", "group_id", "(prompt, response, reward) triplets derived from spans.",
              retention_ms=30 * DAY_MS),
    TopicSpec("workers", "worker_id", "Workers seen through their attempts and dequeues, and their heartbeats.",
              retention_ms=7 * DAY_MS, partitions=1),
    TopicSpec("lineage", "resources_id", "What trained each policy version: its step's samples and their triplets.",
              partitions=1),
)
DLQ_RETENTION_MS = 30 * DAY_MS

# Faust keeps the lifecycle table's changelog here; declared so it is created with the right partition count.
LIFECYCLE_APP = "lifecycle"
LIFECYCLE_TABLE = "rollouts"


@dataclass(frozen=True)
class Topics:
    """Physical topic names for one prefix (tests use a fresh prefix each)."""

    prefix: str

    def name(self, role: str) -> str:
        return f"{self.prefix}.{role}"

    def dlq(self, role: str) -> str:
        return f"{self.prefix}.{role}.dlq"

    @property
    def rollout_events(self) -> str:
        return self.name("rollout-events")

    @property
    def spans(self) -> str:
        return self.name("spans")

    @property
    def offers(self) -> str:
        return self.name("rollout-offers")

    @property
    def state(self) -> str:
        return self.name("rollout-state")

    @property
    def resources(self) -> str:
        return self.name("resources")

    @property
    def triplets(self) -> str:
        return self.name("triplets")

    @property
    def lineage(self) -> str:
        return self.name("lineage")

    @property
    def workers(self) -> str:
        return self.name("workers")

    @property
    def faust_app_id(self) -> str:
        return f"{self.prefix}-{LIFECYCLE_APP}"

    @property
    def lifecycle_changelog(self) -> str:
        return f"{self.faust_app_id}-{LIFECYCLE_TABLE}-changelog"


@dataclass(frozen=True)
class PhysicalTopic:
    name: str
    partitions: int
    config: dict[str, str]
    spec: TopicSpec | None


def check_retention_names(overrides: dict[str, int]) -> None:
    known = {spec.name for spec in CATALOGUE} | {f"{spec.name}.dlq" for spec in CATALOGUE if spec.dlq}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"LITSTREAM_TOPIC_RETENTION_MS names unknown topics {unknown}; known: {sorted(known)}")
    bad = sorted(name for name, ms in overrides.items() if ms < -1 or ms == 0)
    if bad:
        raise ValueError(f"LITSTREAM_TOPIC_RETENTION_MS for {bad}: give milliseconds > 0, or -1 to keep forever")


def physical_topics(settings: Settings) -> list[PhysicalTopic]:
    """Every topic to create, with its DLQ companions and the processors' changelogs."""
    check_retention_names(settings.topic_retention_ms)
    topics = Topics(settings.topic_prefix)
    out: list[PhysicalTopic] = []
    for spec in CATALOGUE:
        partitions = spec.partitions or settings.partitions
        retention = settings.topic_retention_ms.get(spec.name, spec.retention_ms)
        config = {"cleanup.policy": spec.cleanup, "retention.ms": str(retention),
                  **segment_config(spec.cleanup, retention), **spec.extra_config}
        out.append(PhysicalTopic(topics.name(spec.name), partitions, config, spec))
        if spec.dlq:
            # Dead letters are kept for inspection and replay after a fix.
            dlq_retention = settings.topic_retention_ms.get(f"{spec.name}.dlq", DLQ_RETENTION_MS)
            dlq_config = {"retention.ms": str(dlq_retention), **segment_config("delete", dlq_retention)}
            out.append(PhysicalTopic(topics.dlq(spec.name), 1, dlq_config, None))
    out.append(PhysicalTopic(topics.lifecycle_changelog, settings.partitions,
                             {"cleanup.policy": "compact", **segment_config("compact", FOREVER)}, None))
    return out


def segment_config(cleanup: str, retention_ms: int) -> dict[str, str]:
    """How often the active segment is closed, so retention and compaction act within an hour or a day."""
    if cleanup == "compact":
        return {"segment.ms": str(COMPACTED_SEGMENT_MS)}
    if retention_ms > 0:
        return {"segment.ms": str(min(retention_ms, RETAINED_SEGMENT_MS))}
    return {}
