"""OpenTelemetry -> Kafka: every finished span of an ``opentelemetry-sdk`` TracerProvider becomes a ``SpanRecorded``.

Usage::

    provider = TracerProvider(resource=Resource.create({"agentlightning.rollout_id": rid,
                                                        "agentlightning.attempt_id": aid}))
    provider.add_span_processor(KafkaSpanProcessor(settings=Settings()))
    trace.set_tracer_provider(provider)

Why a ``SpanProcessor`` and not a ``SpanExporter`` behind ``BatchSpanProcessor``: ``on_end`` runs in the thread that
ended the span, with the agent's context variables, so the processor can read the active attempt
(:func:`litstream.workers.emitters.current_context`) and take the span's sequence id from it at the moment the span
ends, in end order. An exporter runs later on the batch thread, where the attempt is no longer known, and
``BatchSpanProcessor`` drops silently-counted spans under its own fixed policy. The processor does its own batching.

**Never blocks the agent.** ``on_end`` resolves the ids and puts the span on a bounded in-memory queue; a background
thread converts, encodes and produces in batches of up to ``max_batch_size``. **Queue full: the newest span is
dropped**, counted in ``stats()["dropped_queue_full"]``, with a warning at most every ``WARN_EVERY_S`` seconds. (A
sequence id it took stays unused: ids must increase, they need not be dense.)

**Flushing.** ``force_flush()`` waits until every span queued before the call is produced, sends the pending
heartbeats and flushes the Kafka producer; ``shutdown()`` (called by ``TracerProvider.shutdown``) does the same and
stops the thread. The processor also registers ``shutdown`` with ``atexit``, so a process that exits normally delivers
every span even if its provider was created with ``shutdown_on_exit=False``.

**Rollout and attempt ids**, in this order (as the reference's OTLP ingest, then the SDK): the span attributes
``agentlightning.rollout_id`` / ``agentlightning.attempt_id``; else the resource attributes of the same names; else the
active attempt. A span still without both ids is counted (``dropped_no_ids``) and dropped with a warning, as the
reference drops it.

**Sequence ids**, in this order: the ``agentlightning.span_sequence_id`` span attribute, else the resource attribute
(an LLM proxy stamps one per request); else, when the span belongs to the active attempt, that attempt's counter
(:meth:`AttemptContext.next_sequence_id`, shared with the SDK's own spans); else a counter of this processor per
rollout, starting at 1 and moved past any id seen in attributes. The last one suits a process that writes a rollout
alone; the heartbeats below carry the highest id used, so the rollout's counter moves past ids chosen here.

**Heartbeats.** Spans count as heartbeats, but the lifecycle processor does not read spans: like the SDK, this
processor sends an ``AttemptHeartbeat`` (with ``max_sequence_id``) for an attempt when it produces a span and the
last beat is older than a second (``streams/span_beats.py``, the one policy of every writer of spans); a beat held
back by that throttle is sent within a second, or at the next flush.

**GenAI semantic conventions.** ``gen_ai.*`` attributes pass through unchanged. Token usage has two spellings in
the wild: ``gen_ai.usage.input_tokens`` / ``output_tokens`` (current conventions) and ``gen_ai.usage.prompt_tokens`` /
``completion_tokens`` (older ones, still written by many instrumentations). When a span carries one spelling, the
other is added with the same value, so readers of either find the usage.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import format_span_id, format_trace_id

from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings, get_settings
from litstream.schemas.events import (
    AttemptHeartbeat,
    AttrValue,
    EventFactory,
    SpanRecorded,
)
from litstream.streams.span_beats import SpanBeats

from .emitters import current_context
from .sdk import AttemptContext

log = logging.getLogger("litstream.otel")

ROLLOUT_ID_ATTR = "agentlightning.rollout_id"
ATTEMPT_ID_ATTR = "agentlightning.attempt_id"
SEQUENCE_ID_ATTR = "agentlightning.span_sequence_id"
TOKEN_ALIASES = (("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
                 ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"))
WARN_EVERY_S = 10.0
_INT64_MAX = 2**63 - 1
SPAN_RECORD = SpanRecorded.avro_name


@dataclass(frozen=True)
class _Queued:
    """A finished span with its identity resolved in the agent's thread."""

    span: ReadableSpan
    rollout_id: str
    attempt_id: str
    sequence_id: int
    resources_id: str | None
    worker_id: str | None


# --- conversion (pure) -------------------------------------------------------------------------------------


def _attr_value(value: Any) -> AttrValue:
    """OTel values as the Avro attribute union holds them: tuples become lists; an int too large for a long
    becomes its decimal string rather than failing the whole span."""
    if isinstance(value, (tuple, list)):
        return [_attr_value(v) for v in value]  # type: ignore[misc]
    if isinstance(value, int) and not isinstance(value, bool) and not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def convert_attributes(attributes: Mapping[str, Any] | None) -> dict[str, AttrValue]:
    return {k: _attr_value(v) for k, v in (attributes or {}).items()}


def with_token_aliases(attributes: dict[str, AttrValue]) -> dict[str, AttrValue]:
    """Add the missing spelling of GenAI token usage (input/prompt, output/completion)."""
    for current, legacy in TOKEN_ALIASES:
        if current in attributes and legacy not in attributes:
            attributes[legacy] = attributes[current]
        elif legacy in attributes and current not in attributes:
            attributes[current] = attributes[legacy]
    return attributes


def _sequence_attr(value: Any) -> int | None:
    """A positive sequence id given as an int or a string of digits (the proxy's header value)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 1 else None
    if isinstance(value, str) and value.isdigit() and int(value) >= 1:
        return int(value)
    return None


def span_record(item: _Queued, factory: EventFactory) -> dict[str, Any]:
    """A finished OTel span as the SpanRecorded Avro record, built directly: no model in between (a model's
    validation and dump were half of the exporter thread's time). What the model would check holds by
    construction: ids are OTel's own formatted hex, kind and status are OTel's enums, the end is not before the
    start, the name is never empty, sequence ids are >= 1."""
    span = item.span
    ctx = span.context
    start = span.start_time if span.start_time is not None else time.time_ns()
    scope = span.instrumentation_scope
    return {
        "meta": factory.meta_record(item.rollout_id), "attempt_id": item.attempt_id,
        "sequence_id": item.sequence_id, "trace_id": format_trace_id(ctx.trace_id),
        "span_id": format_span_id(ctx.span_id),
        "parent_id": format_span_id(span.parent.span_id) if span.parent is not None else None,
        "trace_state": ctx.trace_state.to_header() if ctx.trace_state else "", "name": span.name or "unnamed",
        "kind": span.kind.name, "status_code": span.status.status_code.name,
        "status_message": span.status.description, "start_time_ns": start,
        "end_time_ns": max(span.end_time, start) if span.end_time is not None else None,
        "attributes": with_token_aliases(convert_attributes(span.attributes)),
        "events": [{"name": e.name, "timestamp_ns": e.timestamp,
                    "attributes": convert_attributes(e.attributes)} for e in span.events],
        "links": [{"trace_id": format_trace_id(ln.context.trace_id), "span_id": format_span_id(ln.context.span_id),
                   "trace_state": ln.context.trace_state.to_header() if ln.context.trace_state else "",
                   "attributes": convert_attributes(ln.attributes)} for ln in span.links],
        "resource": {"attributes": convert_attributes(span.resource.attributes),
                     "schema_url": span.resource.schema_url or ""},
        "scope_name": scope.name if scope else "", "scope_version": (scope.version or "") if scope else "",
        "resources_id": item.resources_id,
    }


# --- the processor -----------------------------------------------------------------------------------------


class KafkaSpanProcessor(SpanProcessor):
    """Finished OTel spans -> ``SpanRecorded`` events on the spans topic, batched on a background thread.

    See the module docstring for the queue-full policy, id resolution, sequence ids, heartbeats and GenAI usage.
    ``producer`` is shared (e.g. the runner's) and not closed here; without one the processor makes its own from
    ``settings`` (default: the ``LITSTREAM_*`` environment).
    """

    def __init__(self, producer: EventProducer | None = None, *, settings: Settings | None = None,
                 max_queue_size: int = 8192, max_batch_size: int = 512, poll_interval_s: float = 0.2,
                 shutdown_timeout_s: float = 30.0) -> None:
        self.producer = producer or EventProducer(settings or get_settings(), role="otel")
        self.max_batch_size = max_batch_size
        self.poll_interval_s = poll_interval_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self._queue: queue.Queue[_Queued] = queue.Queue(maxsize=max_queue_size)
        self._lock = threading.Lock()  # counters, fallback sequence ids, heartbeat state
        self._done = threading.Condition(self._lock)
        self._stats = {"queued": 0, "sent": 0, "dropped_queue_full": 0, "dropped_no_ids": 0, "dropped_invalid": 0,
                       "heartbeats": 0}
        self._exported = 0  # spans taken off the queue and handled (sent or dropped as invalid)
        self._counters: dict[str, int] = {}
        self._beats = SpanBeats()
        self._last_warning: dict[str, float] = {}
        self._closed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="litstream-otel", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    # -- agent thread --
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        """Resolve ids and queue the span; never blocks, never raises (the SDK calls it in the agent's thread)."""
        try:
            if self._closed or span.context is None or not span.context.trace_flags.sampled:
                return  # unsampled spans are not recorded, as in the reference
            item = self._resolve(span)
            if item is None:
                self._drop("dropped_no_ids", "spans without agentlightning.rollout_id/attempt_id (in span or "
                           "resource attributes, or an active attempt) were dropped")
                return
            try:
                self._queue.put_nowait(item)
            except queue.Full:
                self._drop("dropped_queue_full", f"the span queue is full ({self._queue.maxsize}); the newest spans "
                           "were dropped (Kafka is slower than the agent, or unreachable)")
                return
            with self._lock:
                self._stats["queued"] += 1
        except Exception:  # a processor must not break the agent
            log.exception("could not queue span %r", getattr(span, "name", "?"))

    def _resolve(self, span: ReadableSpan) -> _Queued | None:
        attrs = span.attributes or {}
        res = span.resource.attributes if span.resource is not None else {}
        rollout_id = _str_attr(attrs, ROLLOUT_ID_ATTR) or _str_attr(res, ROLLOUT_ID_ATTR)
        attempt_id = _str_attr(attrs, ATTEMPT_ID_ATTR) or _str_attr(res, ATTEMPT_ID_ATTR)
        ctx = current_context()
        mine = ctx is not None and rollout_id in (None, ctx.rollout_id) and attempt_id in (None, ctx.attempt_id)
        if mine:
            assert ctx is not None
            rollout_id, attempt_id = ctx.rollout_id, ctx.attempt_id
        if not rollout_id or not attempt_id:
            return None
        explicit = _sequence_attr(attrs.get(SEQUENCE_ID_ATTR)) or _sequence_attr(res.get(SEQUENCE_ID_ATTR))
        seq = self._sequence_id(rollout_id, explicit, ctx if mine else None)
        return _Queued(span, rollout_id, attempt_id, seq, ctx.resources_id if mine and ctx else None,
                       ctx.worker_id if mine and ctx else None)

    def _sequence_id(self, rollout_id: str, explicit: int | None, ctx: AttemptContext | None) -> int:
        with self._lock:
            last = self._counters.get(rollout_id, 0)
            if explicit is not None:
                self._counters[rollout_id] = max(last, explicit)  # later fallback ids go past it
                return explicit
            if ctx is not None:
                return ctx.next_sequence_id()
            self._counters[rollout_id] = last + 1
            return last + 1

    def _drop(self, counter: str, message: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._stats[counter] += 1
            total = self._stats[counter]
            warn = now - self._last_warning.get(counter, float("-inf")) >= WARN_EVERY_S
            if warn:
                self._last_warning[counter] = now
        if warn:
            log.warning("%s (%s so far: %d)", message, counter, total)

    # -- background thread --
    def _run(self) -> None:
        while True:
            batch = list(self._take_batch())
            if batch:
                self._export(batch)
            self._send_beats(force=False)
            if self._stop.is_set() and self._queue.empty():
                return

    def _take_batch(self) -> Iterator[_Queued]:
        try:
            yield self._queue.get(timeout=self.poll_interval_s)
        except queue.Empty:
            return
        for _ in range(self.max_batch_size - 1):
            try:
                yield self._queue.get_nowait()
            except queue.Empty:
                return

    def _export(self, batch: list[_Queued]) -> None:
        sent = 0
        for item in batch:
            try:
                self.producer.produce_raw(self.producer.topics.spans, item.rollout_id.encode(),
                                          self.producer.codec.encode_record(SPAN_RECORD, span_record(
                                              item, self.producer.factory)))
                sent += 1
            except Exception as exc:  # noqa: BLE001 (one bad span must not stop the others)
                log.warning("span %r of %s could not be produced: %s", item.span.name, item.rollout_id, exc)
                with self._lock:
                    self._stats["dropped_invalid"] += 1
                continue
            self._note_beat(item)
        with self._done:
            self._stats["sent"] += sent
            self._exported += len(batch)
            self._done.notify_all()

    def _note_beat(self, item: _Queued) -> None:
        self._beats.spans(item.rollout_id, item.attempt_id, item.sequence_id, item.worker_id)

    def _send_beats(self, force: bool) -> None:
        """A heartbeat per attempt with new spans, as ``span_beats`` says (all pending ones when ``force``)."""
        due = self._beats.due(force)
        with self._lock:
            self._stats["heartbeats"] += len(due)
        for beat in due:
            rid, aid = beat.rollout_id, beat.attempt_id
            try:
                self.producer.send(self.producer.topics.rollout_events, AttemptHeartbeat(
                    meta=self.producer.factory.meta(rid), attempt_id=aid, time=time.time(),
                    worker_id=beat.worker_id, max_sequence_id=beat.max_sequence_id))
            except Exception as exc:  # noqa: BLE001 (a lost beat is repaired by the next one)
                log.warning("heartbeat of %s/%s could not be produced: %s", rid, aid, exc)

    # -- flushing --
    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Produce every span queued before this call, send pending heartbeats, and wait for Kafka's acks."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._done:
            target = self._stats["queued"]
            while self._exported < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    log.warning("force_flush: %d spans still queued after %d ms",
                                target - self._exported, timeout_millis)
                    return False
                self._done.wait(min(left, self.poll_interval_s))
        self._send_beats(force=True)
        try:
            self.producer.flush(max(0.001, deadline - time.monotonic()))
        except (RuntimeError, TimeoutError) as exc:
            log.warning("force_flush: %s", exc)
            return False
        return True

    def shutdown(self) -> None:
        """Flush, then stop the background thread. Idempotent; also runs at interpreter exit."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # on_end stops accepting spans
        _LIVE.discard(self)
        self.force_flush(int(self.shutdown_timeout_s * 1000))
        self._stop.set()
        self._thread.join(self.poll_interval_s * 5)

    def stats(self) -> dict[str, int]:
        """Counters: queued, sent, dropped_queue_full, dropped_no_ids, dropped_invalid, heartbeats."""
        with self._lock:
            return dict(self._stats)


# Processors not shut down yet; flushed at interpreter exit, after non-daemon threads have ended and while the
# daemon drain threads still run. One module-level hook, so no processor unregisters itself during atexit.
_LIVE: set[KafkaSpanProcessor] = set()


@atexit.register
def _shutdown_live_processors() -> None:
    for processor in list(_LIVE):
        processor.shutdown()


def _str_attr(attrs: Mapping[str, Any], key: str) -> str | None:
    value = attrs.get(key)
    return value if isinstance(value, str) and value else None
