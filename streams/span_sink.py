"""The span sink: spans topic -> ClickHouse, in batches, committing offsets only after the insert.

Killed at any point, it loses nothing (uncommitted spans are read again) and shows no duplicate (the table
collapses a span's redelivery; see migrations/0001_spans.sql). It owns the chDB directory and serves read-only SQL to other
processes on a loopback API.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition

from litstream.infra import health
from litstream.infra.clickhouse import ClickHouse
from litstream.infra.clickhouse.api import serve_queries
from litstream.infra.kafka import consumer, producer
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec, DecodeError, default_codec
from litstream.schemas.events import SpanRecorded

from .deadletter import DeadLetter
from .span_rows import SPAN_COLUMNS, span_columns

log = logging.getLogger("litstream.span_sink")
ROLE = "span-sink"
SPANS_TABLE = "spans"


class SpanSink:
    def __init__(self, settings: Settings, ch: ClickHouse | None = None, codec: Codec | None = None,
                 batch_size: int = 5000, max_wait_s: float = 0.5) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.codec = codec or default_codec(settings.schema_registry_url)
        self.ch = ch or ClickHouse(settings.resolved_clickhouse_dsn, role=ROLE)
        self.ch.migrate()
        self.batch_size = batch_size
        self.max_wait_s = max_wait_s
        self.stop_event = threading.Event()
        self.stats = {"inserted": 0, "dead_letters": 0, "batches": 0}
        self._consumer = consumer(settings, group_id=f"{settings.topic_prefix}-span-sink")
        self._dlq = producer(settings)

    def serve_api(self, host: str = "127.0.0.1", port: int = 0) -> str:
        server = serve_queries(self.ch, host, port)
        url = f"http://{host}:{server.server_address[1]}"
        self.ch.set_api(url)
        return url

    def run(self) -> None:
        self._consumer.subscribe([self.topics.spans])
        last_beat = 0.0
        try:
            while not self.stop_event.is_set():
                msgs = self._consumer.consume(num_messages=self.batch_size, timeout=self.max_wait_s)
                if msgs:
                    self.process(msgs)
                if time.monotonic() - last_beat > 2.0:
                    health.beat(self.settings.data_dir, ROLE, **self.stats)
                    last_beat = time.monotonic()
        finally:
            self._consumer.close()
            self._dlq.flush(10)

    def process(self, msgs: list[Message]) -> None:
        spans: list[SpanRecorded] = []
        letters: list[DeadLetter] = []
        offsets: dict[tuple[str, int], int] = {}
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", err)
                continue
            topic, partition, offset = str(m.topic()), int(m.partition() or 0), int(m.offset() or 0)
            offsets[(topic, partition)] = offset + 1
            try:
                span = self.codec.decode_as(m.value(), SpanRecorded)
            except DecodeError as exc:
                letters.append(DeadLetter(topic, partition, offset, m.key(), m.value(), exc.reason, ROLE, "decode"))
                continue
            spans.append(span)
        if spans:
            self.ch.insert(SPANS_TABLE, SPAN_COLUMNS, span_columns(spans))
        for letter in letters:
            log.warning("dead letter %s[%d]@%d: %s", letter.source_topic, letter.partition, letter.offset, letter.reason)
            self._dlq.produce(letter.topic, key=letter.key, value=letter.value, headers=letter.headers())
        if letters:
            self._dlq.flush(30)
        # Only now is every message of the batch durable (in ClickHouse or a dead letter): commit.
        if offsets:
            self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                  asynchronous=False)
        self.stats["inserted"] += len(spans)
        self.stats["dead_letters"] += len(letters)
        self.stats["batches"] += 1

    def close(self) -> None:
        self.ch.close()


def run(settings: Settings) -> None:
    """Run the sink in the foreground until SIGINT/SIGTERM."""
    sink = SpanSink(settings)
    url = sink.serve_api()
    log.info("span sink consuming %s into %s; query API %s", sink.topics.spans, sink.ch.dsn, url)

    def stop(*_: Any) -> None:
        sink.stop_event.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        sink.run()
    finally:
        sink.close()
