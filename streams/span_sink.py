"""The sink: spans, rollout-events and triplets topics -> ClickHouse, in Arrow batches, committing offsets only
after the insert.

Undecodable spans go to ``spans.dlq``; undecodable lifecycle events and triplets are dead-lettered by their topics'
main consumers (the lifecycle processor, the trainer), so the sink only counts them. Killed at any point, it loses nothing (uncommitted messages are read again) and shows no duplicate (each table
collapses a redelivered record by its identity; see ``infra/clickhouse/migrations/``). Memory is bounded: a batch
holds at most ``batch_size`` messages, and the client's prefetch queue is capped. One process owns a chDB
directory, so the sink also serves read-only SQL (and the ClickHouse rebuild of ``litstream replay --sink
clickhouse``) to other processes on a loopback API. Its role name stays ``span-sink``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, Message, TopicPartition

from litstream.infra import health, metrics
from litstream.infra.clickhouse import ClickHouse, QueryLimits
from litstream.infra.clickhouse.api import serve_queries
from litstream.infra.failpoints import failpoint
from litstream.infra.kafka import Headers, commit_sync, consumer, producer
from litstream.infra.metrics import StatSeries
from litstream.infra.service import Service
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec, default_codec

from .sink_tables import EVENTS_TABLE, SPANS_TABLE, TRIPLETS_TABLE, SinkBatch, insert_tables, sink_topics

log = logging.getLogger("litstream.span_sink")
ROLE = "span-sink"
PREFETCH_KB = 32 * 1024  # librdkafka's pre-fetched messages, per consumer: the other half of the memory bound
# The sink inserts in batches (every max_wait_s or batch_size records), so it fetches in bulk too: a fetch waits for
# this many bytes or this long. Without it the sink fetched each record as it arrived, and a fetch that finds data
# costs the embedded broker CPU in proportion to the batches its partition holds (docs/benchmarks.md).
FETCH_MIN_BYTES = 1 << 20
FETCH_WAIT_MS = 100
# Records per batch. At the soak's rate a batch closes on max_wait_s (~600 spans); only a sink catching up fills it,
# and then each record is held several times over (decoded, Arrow, the insert's copies inside chDB). 100k spans
# inserted back to back: RSS p50 / max 653 / 797 MiB in batches of 5,000, 557 / 669 MiB in batches of 2,000, for
# ~10-25% more CPU per span while catching up.
BATCH_SIZE = 2000


@dataclass(frozen=True)
class _InFlight:
    """A batch whose insert runs on the inserter thread: committed once that finishes."""

    insert: Future[None]
    batch: SinkBatch
    offsets: dict[tuple[str, int], int]
    started: float
    messages: int


class SpanSink:
    def __init__(self, settings: Settings, ch: ClickHouse | None = None, codec: Codec | None = None,
                 batch_size: int = BATCH_SIZE, max_wait_s: float = 0.5) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.codec = codec or default_codec(settings.schema_registry_url)
        self.ch = ch or ClickHouse(settings.resolved_clickhouse_dsn, role=ROLE, serves_api=True,
                                  limits=QueryLimits.from_settings(settings))
        self.ch.migrate()
        self.batch_size = batch_size
        self.max_wait_s = max_wait_s
        self.stop_event = threading.Event()
        # `inserted` counts spans (what readiness checks look for); the other tables have their own counts.
        self.stats = {"inserted": 0, "events": 0, "triplets": 0, "dead_letters": 0, "undecodable": 0,
                      "batches": 0}
        self._consumer = consumer(settings, group_id=f"{settings.topic_prefix}-span-sink",
                                  **{"queued.max.messages.kbytes": PREFETCH_KB, "fetch.min.bytes": FETCH_MIN_BYTES,
                                     "fetch.wait.max.ms": FETCH_WAIT_MS})
        self._dlq = producer(settings)
        self._inserter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="span-sink-insert")
        self._in_flight: _InFlight | None = None
        self.heartbeat = health.Heartbeat(settings.data_dir, ROLE, self.report)

    def report(self) -> Mapping[str, Any]:
        return dict(self.stats)

    def stop(self) -> None:
        self.stop_event.set()

    def serve_api(self, host: str = "127.0.0.1", port: int = 0) -> str:
        server = serve_queries(self.ch, host, port, actions={"/replay": self._replay_action})
        url = f"http://{host}:{server.server_address[1]}"
        self.ch.set_api(url)
        return url

    def _replay_action(self, body: dict[str, Any]) -> dict[str, Any]:
        from .replay import rebuild_clickhouse  # the rebuild runs here, on the owner's connection

        return rebuild_clickhouse(self.settings, self.ch, truncate=bool(body.get("truncate"))).summary()

    def run(self) -> None:
        self._consumer.subscribe(list(sink_topics(self.topics)))
        try:
            while not self.stop_event.is_set():
                msgs = self._consumer.consume(num_messages=self.batch_size, timeout=self.max_wait_s)
                if msgs:
                    self.process(msgs)
                else:
                    self._complete()  # nothing new: finish the insert in flight now, not with the next batch
                self.heartbeat.tick()
            self._complete()
        finally:
            self._inserter.shutdown(wait=True)
            self._consumer.close()
            self._dlq.flush(10)

    def process(self, msgs: list[Message]) -> None:
        """Decode a batch and make its Arrow tables here, while the previous batch's insert runs on the inserter
        thread (chDB inserts without holding the GIL); then finish that one (dead letters, offsets) and hand this
        one over. One insert in flight at most, and a batch's offsets are committed only after its insert."""
        started = time.perf_counter()
        batch, offsets = self._decode(msgs)
        tables = batch.tables()
        self._complete()
        self._in_flight = _InFlight(self._inserter.submit(self._insert, tables), batch, offsets, started, len(msgs))

    def _insert(self, tables: list[tuple[str, Any]]) -> None:
        insert_tables(self.ch, tables)
        failpoint("span-sink.after-insert")  # fault tests: die with the rows stored and the offsets not committed

    def _decode(self, msgs: list[Message]) -> tuple[SinkBatch, dict[tuple[str, int], int]]:
        batch = SinkBatch(self.topics, self.codec, ROLE)
        offsets: dict[tuple[str, int], int] = {}
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", err)
                continue
            topic, partition, offset = str(m.topic()), int(m.partition() or 0), int(m.offset() or 0)
            offsets[(topic, partition)] = offset + 1
            batch.add(topic, partition, offset, m.key(), m.value())
        return batch, offsets

    def _complete(self) -> None:
        """Wait for the insert in flight (its error is raised here), then dead-letter and commit its batch."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        flight.insert.result()
        self._committed(flight.batch, flight.offsets)
        metrics.SINK_BATCH_SIZE.observe(flight.messages)
        metrics.SINK_BATCH_SECONDS.observe(time.perf_counter() - flight.started)

    def _committed(self, batch: SinkBatch, offsets: dict[tuple[str, int], int]) -> None:
        counts = batch.counts()
        # One dead letter per bad message: the sink writes those of spans; rollout-events has them from the
        # lifecycle processor and triplets from the trainer, so there it only counts them.
        letters = [lt for lt in batch.letters if lt.source_topic == self.topics.spans]
        for letter in batch.letters:
            log.warning("undecodable %s[%d]@%d: %s", letter.source_topic, letter.partition, letter.offset,
                        letter.reason)
        for letter in letters:
            headers: Headers = list(letter.headers())
            self._dlq.produce(letter.topic, key=letter.key, value=letter.value, headers=headers)
            metrics.record_dead_letter(ROLE, letter.source_topic, letter.error_type)
        if letters:
            self._dlq.flush(30)
        # Only now is every message of the batch durable (in ClickHouse or a dead letter): commit.
        if offsets:
            commit_sync(self._consumer, [TopicPartition(t, p, o) for (t, p), o in offsets.items()])
        self.stats["inserted"] += counts[SPANS_TABLE]
        self.stats["events"] += counts[EVENTS_TABLE]
        self.stats["triplets"] += counts[TRIPLETS_TABLE]
        self.stats["dead_letters"] += len(letters)
        self.stats["undecodable"] += len(batch.letters)
        self.stats["batches"] += 1

    def close(self) -> None:
        self.ch.close()


SINK_SERIES = {
    "inserted": StatSeries("litstream_spans", "Spans stored in ClickHouse"),
    "events": StatSeries("litstream_sink_rows", "Rows stored in ClickHouse, by table", {"table": EVENTS_TABLE}),
    "triplets": StatSeries("litstream_sink_rows", "Rows stored in ClickHouse, by table", {"table": TRIPLETS_TABLE}),
    "undecodable": StatSeries("litstream_sink_undecodable", "Messages the sink could not decode (all topics)"),
}


def arrow_memory_pool() -> None:
    """Build the batches' Arrow tables in pyarrow's jemalloc pool, which returns freed memory, where its default
    (mimalloc) kept up to ~100 MiB of the sink's batches: RSS at rest after inserts 437 MiB instead of 495 MiB."""
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # a pyarrow built without jemalloc keeps its default
        log.info("pyarrow has no jemalloc pool; the sink keeps %s", pa.default_memory_pool().backend_name)


def run(settings: Settings) -> None:
    """Run the sink in the foreground until SIGINT/SIGTERM."""
    Service(settings, ROLE, SINK_SERIES).run(start_sink)


def start_sink(settings: Settings) -> SpanSink:
    """The sink with its loopback query API up, its start-up pages given back."""
    arrow_memory_pool()
    sink = SpanSink(settings)
    url = sink.serve_api()
    sink.ch.release_startup_pages()  # ~170 MiB of engine code only its start-up ran (infra/clickhouse/resident.py)
    log.info("sink consuming %s into %s; query API %s", ", ".join(sink_topics(sink.topics)), sink.ch.dsn, url)
    return sink
