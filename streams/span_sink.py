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
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import Message, TopicPartition

from litstream.infra import health, metrics
from litstream.infra.clickhouse import ClickHouse, QueryLimits
from litstream.infra.clickhouse.api import serve_queries
from litstream.infra.failpoints import failpoint
from litstream.infra.kafka import consumer
from litstream.infra.metrics import StatSeries
from litstream.infra.producer import EventProducer
from litstream.infra.service import Service
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec, default_codec

from .consume_loop import ConsumeLoop, Fetch, Offsets, Record, Work
from .deadletter import DeadLetters
from .sink_tables import (
    EVENTS_TABLE,
    ROLLOUTS_TABLE,
    SPANS_TABLE,
    TRIPLETS_TABLE,
    SinkBatch,
    SinkRow,
    decode_row,
    insert_tables,
    sink_topics,
)

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
    """A batch whose insert runs on the inserter thread: its offsets are durable once that finishes."""

    insert: Future[None]
    batch: SinkBatch
    offsets: Offsets
    started: float
    messages: int


class SpanSink(Work[SinkRow]):
    """The sink's part of the consume loop (``consume_loop.py``): records decode to rows, a turn's rows are one
    batch, and a batch's offsets are durable once its insert has finished."""

    def __init__(self, settings: Settings, ch: ClickHouse | None = None, codec: Codec | None = None,
                 batch_size: int = BATCH_SIZE, max_wait_s: float = 0.5) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.codec = codec or default_codec(settings.schema_registry_url)
        self.ch = ch or ClickHouse(settings.resolved_clickhouse_dsn, role=ROLE, serves_api=True,
                                  limits=QueryLimits.from_settings(settings))
        self.ch.migrate()
        # `inserted` counts spans (what readiness checks look for); the other tables have their own counts.
        self.stats = {"inserted": 0, "events": 0, "triplets": 0, "rollouts": 0, "dead_letters": 0, "undecodable": 0,
                      "batches": 0}
        c = consumer(settings, group_id=f"{settings.topic_prefix}-span-sink",
                     **{"queued.max.messages.kbytes": PREFETCH_KB, "fetch.min.bytes": FETCH_MIN_BYTES,
                        "fetch.wait.max.ms": FETCH_WAIT_MS})
        spans = self.topics.spans
        # The sink writes the dead letters of spans; rollout-events has them from the lifecycle processor and
        # triplets from the trainer, so there it only counts them.
        letters = DeadLetters(EventProducer(settings, role=ROLE, codec=self.codec), ROLE,
                              route=lambda letter: letter.topic if letter.source_topic == spans else None)
        self._inserter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="span-sink-insert")
        self._in_flight: _InFlight | None = None
        self._stored: Offsets = {}
        self.heartbeat = health.Heartbeat(settings.data_dir, ROLE, self.report)
        self.loop = ConsumeLoop(c, list(sink_topics(self.topics)), self, letters, self.heartbeat,
                                Fetch(max_records=batch_size, wait_s=max_wait_s, fill=True))
        self.stop_event = self.loop.stop_event

    def report(self) -> Mapping[str, Any]:
        return dict(self.stats)

    def stop(self) -> None:
        self.loop.stop()

    def serve_api(self, host: str = "127.0.0.1", port: int = 0) -> str:
        server = serve_queries(self.ch, host, port, actions={"/replay": self._replay_action})
        url = f"http://{host}:{server.server_address[1]}"
        self.ch.set_api(url)
        return url

    def _replay_action(self, body: dict[str, Any]) -> dict[str, Any]:
        from .replay import rebuild_clickhouse  # the rebuild runs here, on the owner's connection

        return rebuild_clickhouse(self.settings, self.ch, truncate=bool(body.get("truncate"))).summary()

    def run(self) -> None:
        try:
            self.loop.run()
        finally:
            self._inserter.shutdown(wait=True)

    # -- the loop's Work --------------------------------------------------------------------------------------

    def decode(self, msg: Message) -> SinkRow:
        return decode_row(self.topics, self.codec, str(msg.topic()), int(msg.partition() or 0),
                          int(msg.offset() or 0), msg.value())

    def apply(self, records: list[Record[SinkRow]], read: Offsets) -> None:
        """Make this batch's Arrow tables here, while the previous batch's insert runs on the inserter thread
        (chDB inserts without holding the GIL); then finish that one and hand this one over. One insert in
        flight at most. Nothing new: finish the insert in flight now, not with the next batch."""
        if not read:
            self._complete()
            return
        started = time.perf_counter()
        batch = SinkBatch(self.topics, self.codec, ROLE)
        for r in records:
            batch.append(r.decoded)
        tables = batch.tables()
        self._complete()
        self._in_flight = _InFlight(self._inserter.submit(self._insert, tables), batch, read, started, len(records))

    def durable(self, wait: bool) -> Offsets:
        if wait:
            self._complete()
        return self._stored

    def revoked(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._stored.pop((tp.topic, tp.partition), None)

    def _insert(self, tables: list[tuple[str, Any]]) -> None:
        insert_tables(self.ch, tables)
        failpoint("span-sink.after-insert")  # fault tests: die with the rows stored and the offsets not committed

    def _complete(self) -> None:
        """Wait for the insert in flight (its error is raised here); its batch's offsets are then durable."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        flight.insert.result()
        self._stored.update(flight.offsets)
        counts = flight.batch.counts()
        letters = self.loop.letters
        self.stats.update(dead_letters=letters.written, undecodable=letters.seen)
        self.stats["inserted"] += counts[SPANS_TABLE]
        self.stats["events"] += counts[EVENTS_TABLE]
        self.stats["triplets"] += counts[TRIPLETS_TABLE]
        self.stats["rollouts"] += counts[ROLLOUTS_TABLE]
        self.stats["batches"] += 1
        metrics.SINK_BATCH_SIZE.observe(flight.messages)
        metrics.SINK_BATCH_SECONDS.observe(time.perf_counter() - flight.started)

    def close(self) -> None:
        self.ch.close()


SINK_SERIES = {
    "inserted": StatSeries("litstream_spans", "Spans stored in ClickHouse"),
    "events": StatSeries("litstream_sink_rows", "Rows stored in ClickHouse, by table", {"table": EVENTS_TABLE}),
    "triplets": StatSeries("litstream_sink_rows", "Rows stored in ClickHouse, by table", {"table": TRIPLETS_TABLE}),
    "rollouts": StatSeries("litstream_sink_rows", "Rows stored in ClickHouse, by table", {"table": ROLLOUTS_TABLE}),
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
