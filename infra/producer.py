"""Producing events: validated records, encoded with the codec, keyed, sent with the idempotent producer."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from litstream.infra.kafka import Headers, flush_or_raise, producer
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec, default_codec
from litstream.schemas.events import AvroModel, EventFactory

log = logging.getLogger("litstream.producer")
POLL_EVERY = 64
SEND_NOW_WINDOW_S = 0.002  # how long one send_now keeps the producer sending without linger


class EventProducer:
    """One Kafka producer per process, shared by every emitter in it (thread-safe)."""

    def __init__(self, settings: Settings, role: str = "client", codec: Codec | None = None,
                 **producer_overrides: Any) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.codec = codec or default_codec(settings.schema_registry_url)
        self.factory = EventFactory(settings.producer_id, role=role, run_id=settings.run_id)
        self._errors: list[str] = []
        self._errors_lock = threading.Lock()  # delivery reports are served on whichever thread polls or flushes
        self._producer = producer(settings, **{"client.id": f"litstream-{role}", **producer_overrides})
        self._unpolled = 0  # records produced since the last poll (a race between threads only shifts a poll)
        self._closed = False
        self._send_now = threading.Event()
        self._sender: threading.Thread | None = None

    @property
    def producer_id(self) -> str:
        return self.factory.producer_id

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            with self._errors_lock:
                self._errors = [*self._errors[-99:], f"{msg.topic()}: {err}"]  # the newest, for the next flush
            log.error("delivery to %s failed: %s", msg.topic(), err)

    def send(self, topic: str, record: AvroModel, on_delivery: Any = None) -> None:
        """Encode and enqueue ``record``; the key is the record's own (rollout id, resources id, group id).
        ``on_delivery(err, msg)`` is called from a ``poll`` or ``flush`` once the broker answered."""
        self.produce_raw(topic, str(record.key).encode(), self.codec.encode(record),  # type: ignore[attr-defined]
                         on_delivery=on_delivery)

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery reports (of any thread's records) for up to ``timeout`` seconds."""
        self._producer.poll(timeout)

    def produce_raw(self, topic: str, key: bytes | None, value: bytes | None, on_delivery: Any = None,
                    headers: Iterable[tuple[str, bytes]] | None = None) -> None:
        """Enqueue an encoded record; waits while the local queue is full (back-pressure, never a drop)."""
        kafka_headers: Headers | None = None if headers is None else list(headers)
        report = self._on_delivery if on_delivery is None else self._reporter(on_delivery)
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, on_delivery=report, headers=kafka_headers)
                break
            except BufferError:  # local queue full: serve delivery reports, then retry
                self._producer.poll(0.1)
        # Delivery reports are served every POLL_EVERY records, not after each: a poll per record costs as much
        # as the produce itself. flush() and a full queue serve them too, so none is lost, only later.
        self._unpolled += 1
        if self._unpolled >= POLL_EVERY:
            self._unpolled = 0
            self._producer.poll(0)

    def send_now(self) -> None:
        """Send what is queued without waiting out ``linger.ms``, off the caller's thread (it returns at once).

        With a long linger this is group commit: while a caller has more input at hand its records wait and batch
        (fewer, larger batches: fewer requests for the broker to store and serve), and when the input
        runs dry it calls this, so the last records do not wait for the linger. librdkafka sends at once while a
        flush is in progress, so a helper thread flushes for a moment; errors surface at the next ``flush``. Best
        effort: a record that cannot leave within that moment (its partition still unknown) waits out the linger.
        """
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_when_asked, name="send-now", daemon=True)
            self._sender.start()
        self._send_now.set()

    def _send_when_asked(self) -> None:
        while True:
            self._send_now.wait()
            self._send_now.clear()
            if self._closed:
                return
            self._producer.flush(SEND_NOW_WINDOW_S)

    def _reporter(self, on_delivery: Any) -> Any:
        def report(err: Any, msg: Any) -> None:
            self._on_delivery(err, msg)
            on_delivery(err, msg)

        return report

    def flush(self, timeout: float | None = 30.0) -> None:
        """Wait for every event's acknowledgement (``timeout=None``: as long as the producer keeps one; see
        :func:`flush_or_raise`); raises if the broker refused one."""
        flush_or_raise(self._producer, timeout)
        with self._errors_lock:
            errors, self._errors = self._errors, []
        if errors:
            raise RuntimeError(f"{len(errors)} events were not delivered: {errors[:3]}")

    def close(self) -> None:
        """Deliver what is queued, then let the producer go: its connections close now, not when the object is
        collected (a producer kept alive past its broker retries it forever; the broker waits for it to stop).
        Closing twice is harmless."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._send_now.set()  # the helper thread, if any, sees the close and ends
        if self._sender is not None:
            self._sender.join(timeout=5)
        close = getattr(self._producer, "close", None)  # confluent-kafka >= 2.13
        if close is not None:
            close()
