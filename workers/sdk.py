"""The agent-side SDK: inside an attempt, record spans and rewards as events on Kafka.

Values are validated when the call is made, so a bad value raises at the call site instead of poisoning a topic.
Span names and attribute keys follow the reference (e.g. rewards are ``agentlightning.annotation`` spans with
``agentlightning.reward.0.name`` / ``.value``).
"""

from __future__ import annotations

import contextvars
import json
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from litstream.infra.producer import EventProducer
from litstream.schemas.events import (
    AttemptHeartbeat,
    AttemptStatusChanged,
    AttrValue,
    ResourceRecord,
    SpanRecorded,
)
from litstream.streams.span_beats import SpanBeats

from .attributes import (
    MAX_ATTRIBUTES,
    MAX_SPAN_ATTRIBUTE_BYTES,
    check_leaf,
    flatten_attributes,
    value_size,
)
from .semconv import ANNOTATION_SPAN, reward_attributes

# How long ``finish`` waits for the attempt's own spans to be delivered in the producer's normal batches before it
# forces them out with a flush. A flush sends every queued record of the process at once, in small batches, and
# does not make a busy broker answer sooner: with 0.5 s here, a loaded broker's slower acks turned most attempts'
# ends into flushes, whose small batches loaded it further. Waiting threads block in the producer's poll (which
# serves everyone's delivery reports) rather than spin.
SPAN_DELIVERY_WAIT_S = 5.0
SPAN_POLL_S = 0.05
_current_span: contextvars.ContextVar[SpanHandle | None] = contextvars.ContextVar("litstream_span", default=None)
T = TypeVar("T")

# A tool's execution (OpenTelemetry GenAI semantic conventions, ``execute_tool`` spans): ``AttemptContext.tool_span``.
TOOL_OPERATION = "execute_tool"
TOOL_NAME_ATTR = "gen_ai.tool.name"
TOOL_CALL_ID_ATTR = "gen_ai.tool.call.id"
TOOL_ARGUMENTS_ATTR = "gen_ai.tool.call.arguments"
TOOL_RESULT_ATTR = "gen_ai.tool.call.result"


@dataclass
class SpanHandle:
    """An open span: set attributes on it; it is recorded when its ``with`` block ends.

    Values are checked as they are set, limits included (``attributes.py``): the call that breaks one raises."""

    name: str
    span_id: str
    parent_id: str | None
    start_time_ns: int
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    status_code: str = "UNSET"
    status_message: str | None = None
    _bytes: int = field(default=0, repr=False)

    def set_attribute(self, key: str, value: AttrValue) -> None:
        self._put(key, check_leaf(value, f"attribute {key!r}"))  # fails here, not when the span ends

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        for key, value in flatten_attributes(attributes).items():
            self._put(key, value)

    def _put(self, key: str, value: AttrValue) -> None:
        old = self.attributes.get(key)
        if key not in self.attributes and len(self.attributes) >= MAX_ATTRIBUTES:
            raise ValueError(f"span {self.name!r}: attribute {key!r} would be its {len(self.attributes) + 1}th, "
                             f"over the limit of {MAX_ATTRIBUTES} per span")
        if key in self.attributes:  # a new value for a key already counted
            size = self._bytes - value_size(old) + value_size(value)
        else:
            size = self._bytes + len(key.encode("utf-8", errors="surrogatepass")) + value_size(value)
        if size > MAX_SPAN_ATTRIBUTE_BYTES:
            raise ValueError(f"span {self.name!r}: attribute {key!r} would bring its attributes to {size} bytes, "
                             f"over the limit of {MAX_SPAN_ATTRIBUTE_BYTES} per span")
        self.attributes[key] = value
        self._bytes = size


def _json_text(value: Any, argument: str) -> str:
    """A string as it is; anything else as strict JSON (``TypeError`` naming ``argument`` when it is not JSON)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"{argument}: a {type(value).__name__} cannot be written as JSON ({exc}); give a str or "
                        "a JSON-serialisable value") from None


def tool_call_attributes(name: str, arguments: str | Mapping[str, Any],
                         call_id: str | None = None) -> dict[str, AttrValue]:
    """The attributes an ``execute_tool`` span starts with; ``arguments`` as the model wrote them (a string, kept
    as it is even when it is not JSON) or as a dict (written as JSON). Raises ``TypeError`` / ``ValueError``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be the tool's name, a non-empty str, got {name!r}")
    if isinstance(arguments, (str, Mapping)):
        text = _json_text(arguments, "arguments")
    else:
        raise TypeError(f"arguments must be a str (the call's JSON as the model wrote it) or a dict, got "
                        f"{type(arguments).__name__}")
    if call_id is not None and (not isinstance(call_id, str) or not call_id):
        raise TypeError(f"call_id must be a non-empty str or None, got {call_id!r}")
    attrs: dict[str, AttrValue] = {"gen_ai.operation.name": TOOL_OPERATION, TOOL_NAME_ATTR: name,
                                   TOOL_ARGUMENTS_ATTR: text}
    if call_id is not None:
        attrs[TOOL_CALL_ID_ATTR] = call_id
    return attrs


@dataclass
class ToolExecution:
    """The open ``execute_tool`` span of :meth:`AttemptContext.tool_span`: ``result`` records what the tool gave."""

    span: SpanHandle

    def result(self, value: T) -> T:
        """Record the tool's result (a str as it is, anything else as JSON) and hand it back, so that
        ``return t.result(run_tool(...))`` reads as one line."""
        self.span.set_attribute(TOOL_RESULT_ATTR, _json_text(value, "result"))
        return value


class AttemptContext:
    """Everything an agent emits during one attempt is stamped with its rollout, attempt and a sequence id."""

    def __init__(self, producer: EventProducer, rollout_id: str, attempt_id: str, *, resources_id: str | None = None,
                 worker_id: str | None = None, first_sequence_id: int = 1, service_name: str = "litstream-agent") -> None:
        self.producer = producer
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.resources_id = resources_id
        self.worker_id = worker_id
        self.trace_id = secrets.token_hex(16)
        self._next_seq = first_sequence_id
        self._first_seq = first_sequence_id
        self._lock = threading.Lock()
        self.resource = ResourceRecord(attributes={"service.name": service_name,
                                                   "agentlightning.rollout_id": rollout_id,
                                                   "agentlightning.attempt_id": attempt_id})
        self.spans_emitted = 0
        self.last_reward: float | None = None  # the primary value of the latest reward emitted (progress lines)
        # Spans count as heartbeats, but the lifecycle processor reads no spans: see streams/span_beats.py.
        self._beats = SpanBeats()
        self._undelivered = 0  # this attempt's spans not yet acknowledged by the broker
        self._span_errors: list[str] = []

    def _sequence_id(self) -> int:
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            return seq

    def next_sequence_id(self) -> int:
        """Take the attempt's next span sequence id for a span recorded elsewhere (e.g. by the OpenTelemetry
        processor); heartbeats report it like the ids of :meth:`span`, so the rollout's counter moves past it."""
        return self._sequence_id()

    @property
    def max_sequence_id(self) -> int | None:
        """The highest sequence id this attempt has taken, or None before the first."""
        with self._lock:
            return self._next_seq - 1 if self._next_seq > self._first_seq else None

    # -- spans --
    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[SpanHandle]:
        """A child of the current span; ``attributes`` as ``set_attributes`` takes them (nested dicts flatten)."""
        parent = _current_span.get()
        handle = SpanHandle(name=name, span_id=secrets.token_hex(8), parent_id=parent.span_id if parent else None,
                            start_time_ns=time.time_ns())
        handle.set_attributes(attributes or {})
        token = _current_span.set(handle)
        try:
            yield handle
        except BaseException as exc:
            handle.status_code, handle.status_message = "ERROR", f"{type(exc).__name__}: {exc}"
            raise
        finally:
            _current_span.reset(token)
            self._record(handle, time.time_ns())

    def tool_span(self, name: str, arguments: str | Mapping[str, Any],
                  call_id: str | None = None) -> AbstractContextManager[ToolExecution]:
        """A tool's execution as a span ``execute_tool {name}``, the OpenTelemetry GenAI convention::

            with ctx.tool_span("get_weather", call.function.arguments, call_id=call.id) as t:
                t.result(get_weather(**json.loads(call.function.arguments)))

        The arguments are checked here, before the block runs. The span ends with the block: status OK, or
        ERROR with ``error.type`` when the tool raised (the exception goes on)."""
        return self._tool_span(name, tool_call_attributes(name, arguments, call_id))

    @contextmanager
    def _tool_span(self, name: str, attributes: dict[str, AttrValue]) -> Iterator[ToolExecution]:
        with self.span(f"{TOOL_OPERATION} {name}", attributes) as handle:
            try:
                yield ToolExecution(handle)
            except BaseException as exc:
                cls = type(exc)
                handle.set_attribute("error.type", cls.__qualname__ if cls.__module__ == "builtins"
                                     else f"{cls.__module__}.{cls.__qualname__}")
                raise
            handle.status_code = "OK"

    def _record(self, h: SpanHandle, end_ns: int) -> None:
        span = SpanRecorded(
            meta=self.producer.factory.meta(self.rollout_id), attempt_id=self.attempt_id,
            sequence_id=self._sequence_id(), trace_id=self.trace_id, span_id=h.span_id, parent_id=h.parent_id,
            name=h.name, status_code=h.status_code, status_message=h.status_message,  # type: ignore[arg-type]
            start_time_ns=h.start_time_ns, end_time_ns=end_ns, attributes=h.attributes, resource=self.resource,
            scope_name="litstream.sdk", resources_id=self.resources_id,
        )
        with self._lock:
            self._undelivered += 1
        self.producer.send(self.producer.topics.spans, span, on_delivery=self._span_delivered)
        self.spans_emitted += 1
        self._beats.spans(self.rollout_id, self.attempt_id, self.max_sequence_id)
        if self._beats.due_for(self.rollout_id, self.attempt_id) is not None:
            self._send_heartbeat()

    def note_reward(self, value: float | Mapping[str, float], primary_key: str | None = None) -> None:
        """Remember a reward's primary value for the runner's progress line."""
        if isinstance(value, Mapping):
            primary = value.get(primary_key) if primary_key else next(iter(value.values()), None)
            self.last_reward = float(primary) if isinstance(primary, (int, float)) else None
        else:
            self.last_reward = float(value)

    def emit_reward(self, value: float | dict[str, float], primary_key: str | None = None) -> None:
        """Record a reward as the reference does: an ``agentlightning.annotation`` span (see emitters.py)."""
        self.note_reward(value, primary_key)
        with self.span(ANNOTATION_SPAN, reward_attributes(value, primary_key)) as handle:
            handle.status_code = "OK"

    # -- lifecycle --
    def heartbeat(self) -> None:
        """Say the attempt is alive; also moves the rollout's span counter past the ids used here."""
        self._beats.spans(self.rollout_id, self.attempt_id, self.max_sequence_id)
        self._beats.due_for(self.rollout_id, self.attempt_id, urgent=True)  # sent now: the next span's is a second off
        self._send_heartbeat()

    def _send_heartbeat(self) -> None:
        used = self.max_sequence_id
        self.producer.send(self.producer.topics.rollout_events, AttemptHeartbeat(
            meta=self.producer.factory.meta(self.rollout_id), attempt_id=self.attempt_id, time=time.time(),
            worker_id=self.worker_id, max_sequence_id=used))

    def _span_delivered(self, err: Any, msg: Any) -> None:
        with self._lock:
            self._undelivered -= 1
            if err is not None:
                self._span_errors.append(str(err))

    def _await_spans(self) -> None:
        """Until every span of this attempt is on the broker: its own delivery reports, then a flush if slow."""
        deadline = time.monotonic() + SPAN_DELIVERY_WAIT_S
        while self._undelivered > 0 and time.monotonic() < deadline:
            self.producer.poll(SPAN_POLL_S)
        if self._undelivered > 0:
            self.producer.flush()
        if self._span_errors:
            errors, self._span_errors = self._span_errors, []
            raise RuntimeError(f"{len(errors)} spans of attempt {self.attempt_id} were not delivered: {errors[:3]}")

    def finish(self, status: str, error: str | None = None) -> None:
        """End the attempt. Its spans are on the broker before the terminal event is sent, so they are written
        before the snapshot that ends the attempt: the triplet processor relies on that order (a slow producer
        could otherwise deliver spans after their attempt was turned into triplets). It waits for this attempt's
        spans only, in the batches the producer was making anyway: a process running many attempts does not
        flush everyone's records at each attempt's end."""
        if self.max_sequence_id is not None:
            self.heartbeat()  # the counter moves past this attempt's spans before the next attempt starts
        self._await_spans()
        self.producer.send(self.producer.topics.rollout_events, AttemptStatusChanged(
            meta=self.producer.factory.meta(self.rollout_id), attempt_id=self.attempt_id, status=status,  # type: ignore[arg-type]
            time=time.time(), worker_id=self.worker_id, error=error))


_current_attempt: contextvars.ContextVar[AttemptContext | None] = contextvars.ContextVar("litstream_attempt",
                                                                                        default=None)


@contextmanager
def attempt_context(ctx: AttemptContext) -> Iterator[AttemptContext]:
    """Make ``ctx`` the active attempt (the runner does this around the agent): emitters record into it."""
    token = _current_attempt.set(ctx)
    try:
        yield ctx
    finally:
        _current_attempt.reset(token)


def current_attempt() -> AttemptContext | None:
    return _current_attempt.get()
