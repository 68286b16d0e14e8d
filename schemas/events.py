"""Events: immutable facts, one Avro record each (the `.avsc` files in `avro/` are the source of truth).

Field names mirror the Avro records, except that a field listed in ``json_fields`` (free-form JSON such as a
task input) travels as the string field ``<name>_json``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from types import UnionType
from typing import Any, ClassVar, Literal, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .models import AttemptStatus, RolloutConfig, RolloutMode, RolloutStatus, StatusCode
from .trusted import assemble, trusted

AttrValue = bool | int | float | str | list[bool | int | float | str | None] | None


# Compact JSON, as json.dumps(separators=(",", ":"), ensure_ascii=False) gives it; one encoder made once (dumps
# with arguments builds a new one per call, half of its time for a small value).
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class AvroModel(BaseModel):
    """A pydantic model that is one Avro record."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    json_fields: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _decode_json_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.json_fields:
            data = dict(data)
            for name in cls.json_fields:
                raw = data.pop(f"{name}_json", None)
                if raw is not None and name not in data:
                    data[name] = json.loads(raw)
        return data

    @model_validator(mode="after")
    def _json_fields_serialisable(self) -> AvroModel:
        for name in self.json_fields:
            try:
                _dumps(getattr(self, name))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"field {name!r} must be JSON-serialisable: {exc}") from None
        return self

    def to_record(self) -> dict[str, Any]:
        """The Avro record: the model's fields, nested models as their records, each JSON field as its string.

        Read from the validated model's fields directly: what ``model_dump()`` gives for these models (fields
        are Avro types, JSON fields were checked to serialise), without its generic walk over every value."""
        return _plan_of(type(self)).record(self, tag=False)

    def to_wire_record(self) -> dict[str, Any]:
        """:meth:`to_record` for fastavro's writer: attribute values tagged with their union branch (fastavro's
        tuple notation), which spares it trying each branch of the attribute union in turn (measured: +40% on
        the writer's part for a span with 17 attributes)."""
        return _plan_of(type(self)).record(self, tag=True)

    @classmethod
    def trusted(cls, **fields: Any) -> Self:
        """The model of values that are valid already, every field given, without validating them again
        (:func:`schemas.trusted.trusted`)."""
        return trusted(cls, fields)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Self:
        """The model of a record the codec decoded, without validating it again.

        Records on the log were validated where they were made (every producer builds the model); decoding them
        is on every consumer's hot path. Raises ValueError when a JSON field is not JSON.
        """
        return _plan_of(cls).load(record)  # type: ignore[return-value]


# --- fast paths between models and Avro records ---------------------------------------------------------------
# For each model class, which fields need more than a copy: JSON fields (a string on the wire) and nested models
# (a dict on the wire). Computed once per class from the pydantic field annotations.


def _strip_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


class _Nested:
    """How a field holds a model: ``one`` model, a ``list`` of them, or a ``dict`` of them."""

    def __init__(self, shape: str, cls: type[BaseModel]) -> None:
        self.shape = shape
        self.cls = cls
        self._plan: _Plan | None = None

    @property
    def plan(self) -> _Plan:
        if self._plan is None:  # on first use: a class's plan is made after its nested classes' are defined
            self._plan = _plan_of(self.cls)
        return self._plan

    def _each(self, value: Any, convert: Callable[[Any], Any]) -> Any:
        """``convert`` applied to the field's one value, or to each of its list or dict (None stays None)."""
        if value is None:
            return None
        if self.shape == "one":
            return convert(value)
        if self.shape == "list":
            return [convert(v) for v in value]
        return {k: convert(v) for k, v in value.items()}

    def load(self, value: Any) -> Any:
        return self._each(value, self.plan.load)

    def record(self, value: Any, tag: bool) -> Any:
        """The field's model(s) -> Avro record(s)."""
        plan = self.plan
        return self._each(value, lambda v: plan.record(v, tag))

    def tagged(self, value: Any) -> Any:
        """The field's record(s), built without a model, with attribute values tagged (see :meth:`_Plan.tagged`)."""
        return self._each(value, self.plan.tagged)


def _nested(annotation: Any) -> _Nested | None:
    annotation = _strip_optional(annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _Nested("one", annotation)
    if origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return _Nested("list", args[0])
    if origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return _Nested("dict", args[1])
    return None


# The branch of the attribute union (see SpanRecorded.avsc) that holds each Python type of AttrValue.
_BRANCH: dict[type, str] = {str: "string", bool: "boolean", int: "long", float: "double", type(None): "null",
                            list: "array"}


def tagged_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attribute values in fastavro's tuple notation: (union branch, value)."""
    return {k: (b, v) if (b := _BRANCH.get(type(v))) is not None else v for k, v in attributes.items()}


class _Plan:
    """Model <-> Avro record for one class."""

    def __init__(self, cls: type[BaseModel]) -> None:
        self.cls = cls
        self.names = tuple(cls.model_fields)
        self.name_set = frozenset(self.names)
        self.json_fields: tuple[str, ...] = tuple(sorted(getattr(cls, "json_fields", ())))
        self.nested = {name: n for name, f in cls.model_fields.items() if (n := _nested(f.annotation)) is not None}
        self.nested_items = tuple(self.nested.items())
        # A JSON field written as null by another version of a schema takes this model's default.
        self.json_defaults = {name: cls.model_fields[name].get_default(call_default_factory=True)
                              for name in self.json_fields}
        self.attr_fields: tuple[str, ...] = tuple(getattr(cls, "attr_fields", ()))

    def record(self, model: BaseModel, tag: bool) -> dict[str, Any]:
        """Model -> Avro record, from the model's fields (a shallow copy; the model is not changed)."""
        data = model.__dict__.copy()
        for name in self.json_fields:
            data[f"{name}_json"] = _dumps(data.pop(name))
        if tag:
            for name in self.attr_fields:
                data[name] = tagged_attributes(data[name])
        for name, nested in self.nested_items:
            data[name] = nested.record(data[name], tag)
        return data

    def tagged(self, record: dict[str, Any]) -> dict[str, Any]:
        """A record built without a model, as :meth:`record` with ``tag`` gives it: attribute values tagged with
        their union branch, in new dicts (the record, whose parts may be shared, is not changed)."""
        data = dict(record)
        for name in self.attr_fields:
            if data.get(name) is not None:
                data[name] = tagged_attributes(data[name])
        for name, nested in self.nested_items:
            if name in data:
                data[name] = nested.tagged(data[name])
        return data

    def _parse_json(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record with each JSON field parsed, in the model's field order (a model dumps in its dict's)."""
        out: dict[str, Any] = {}
        for name in self.names:
            if name in self.json_defaults:
                raw = record.get(f"{name}_json")
                out[name] = json.loads(raw) if raw is not None else self.json_defaults[name]
            elif name in record:
                out[name] = record[name]
        return out

    def load(self, record: dict[str, Any]) -> BaseModel:
        """Avro record -> model, trusted (in place on the record)."""
        if self.json_fields:
            record = self._parse_json(record)
        for name, nested in self.nested_items:
            record[name] = nested.load(record[name])
        if record.keys() != self.name_set:
            return self.cls.model_validate(record)  # another shape than this code's (evolution): the slow path
        return assemble(self.cls, record, set(self.name_set))



_PLANS: dict[type[BaseModel], _Plan] = {}


def tagged_record(cls: type[BaseModel], record: dict[str, Any]) -> dict[str, Any]:
    """A record of ``cls`` built without a model, made ready for fastavro's writer (:meth:`_Plan.tagged`)."""
    return _plan_of(cls).tagged(record)


def _plan_of(cls: type[BaseModel]) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _Plan(cls)
    return plan


class EventMeta(AvroModel):
    event_id: str = Field(min_length=1)
    rollout_id: str = Field(min_length=1)
    producer_id: str = Field(min_length=1)
    producer_seq: int = Field(ge=0)
    timestamp_ns: int = Field(ge=0)
    run_id: str | None = None  # the training run (None: none, or an event written before runs were recorded)


class Event(AvroModel):
    """A rollout-scoped event (keyed by rollout id)."""

    avro_name: ClassVar[str]
    meta: EventMeta

    @property
    def rollout_id(self) -> str:
        return self.meta.rollout_id

    @property
    def key(self) -> str:
        return self.meta.rollout_id


class AvroRolloutConfig(RolloutConfig):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- Lifecycle ---------------------------------------------------------------------------------------------


class RolloutEnqueued(Event):
    avro_name = "litstream.RolloutEnqueued"
    json_fields = frozenset({"input", "metadata"})
    input: Any
    start_time: float
    mode: RolloutMode | None = None
    resources_id: str | None = None
    config: AvroRolloutConfig = Field(default_factory=AvroRolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    start_attempt_id: str | None = None  # start_rollout: begin at once with this attempt, no offer
    worker_id: str | None = None

    @classmethod
    def new(cls, factory: EventFactory, rollout_id: str, input: Any, *, mode: RolloutMode | None = None,
            resources_id: str | None = None, config: RolloutConfig | None = None,
            metadata: dict[str, Any] | None = None, start_attempt_id: str | None = None,
            worker_id: str | None = None) -> Self:
        """The event that enqueues (or, with ``start_attempt_id``, starts) a new rollout: the one way every
        writer (the store, the SDK, the CLI, the trainer) builds it."""
        return cls(meta=factory.meta(rollout_id), input=input, start_time=time.time(), mode=mode,
                   resources_id=resources_id, config=AvroRolloutConfig(**(config.model_dump() if config else {})),
                   metadata=metadata or {}, start_attempt_id=start_attempt_id, worker_id=worker_id)


class RolloutStatusChanged(Event):
    avro_name = "litstream.RolloutStatusChanged"
    status: RolloutStatus
    time: float
    reason: str | None = None


class AttemptStarted(Event):
    avro_name = "litstream.AttemptStarted"
    attempt_id: str = Field(min_length=1)
    sequence_id: int = Field(ge=1)
    start_time: float
    worker_id: str | None = None
    force: bool = False  # start_attempt: whatever the status and max_attempts; the fold numbers it


class AttemptHeartbeat(Event):
    avro_name = "litstream.AttemptHeartbeat"
    attempt_id: str = Field(min_length=1)
    time: float
    worker_id: str | None = None
    max_sequence_id: int | None = None  # the rollout's span counter moves past this


class AttemptStatusChanged(Event):
    avro_name = "litstream.AttemptStatusChanged"
    attempt_id: str = Field(min_length=1)
    status: AttemptStatus
    time: float
    worker_id: str | None = None
    error: str | None = None


ROLLOUT_FIELDS = frozenset({"status", "input", "mode", "resources_id", "config", "metadata"})
ATTEMPT_FIELDS = frozenset({"status", "worker_id", "last_heartbeat_time", "metadata"})


class RolloutUpdated(Event):
    """update_rollout: the fields in ``set_fields`` change, the others stay (UNSET is not null)."""

    avro_name = "litstream.RolloutUpdated"
    json_fields = frozenset({"input", "metadata"})
    time: float
    set_fields: list[str]
    status: RolloutStatus | None = None
    input: Any = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    config: AvroRolloutConfig | None = None
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _known_fields(self) -> RolloutUpdated:
        unknown = set(self.set_fields) - ROLLOUT_FIELDS
        if unknown:
            raise ValueError(f"set_fields: unknown rollout fields {sorted(unknown)}")
        return self


class AttemptUpdated(Event):
    """update_attempt: the fields in ``set_fields`` change."""

    avro_name = "litstream.AttemptUpdated"
    json_fields = frozenset({"metadata"})
    attempt_id: str = Field(min_length=1)
    time: float
    set_fields: list[str]
    status: AttemptStatus | None = None
    worker_id: str | None = None
    last_heartbeat_time: float | None = None
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _known_fields(self) -> AttemptUpdated:
        unknown = set(self.set_fields) - ATTEMPT_FIELDS
        if unknown:
            raise ValueError(f"set_fields: unknown attempt fields {sorted(unknown)}")
        return self


class SequenceRequested(Event):
    """Reserve ``count`` span sequence ids; the snapshot that follows gives the first (``last_reserved``)."""

    avro_name = "litstream.SequenceRequested"
    attempt_id: str = ""
    count: int = Field(1, ge=1, le=1_000_000)


LifecycleEvent = (RolloutEnqueued | RolloutStatusChanged | AttemptStarted | AttemptHeartbeat | AttemptStatusChanged
                  | RolloutUpdated | AttemptUpdated | SequenceRequested)


# --- Spans -------------------------------------------------------------------------------------------------


class SpanEventRecord(AvroModel):
    attr_fields: ClassVar[tuple[str, ...]] = ("attributes",)
    name: str
    timestamp_ns: int | None = None
    attributes: dict[str, AttrValue] = Field(default_factory=dict)


class SpanLinkRecord(AvroModel):
    attr_fields: ClassVar[tuple[str, ...]] = ("attributes",)
    trace_id: str
    span_id: str
    trace_state: str = ""
    attributes: dict[str, AttrValue] = Field(default_factory=dict)


class ResourceRecord(AvroModel):
    attr_fields: ClassVar[tuple[str, ...]] = ("attributes",)
    attributes: dict[str, AttrValue] = Field(default_factory=dict)
    schema_url: str = ""


class SpanRecorded(Event):
    avro_name = "litstream.SpanRecorded"
    attr_fields: ClassVar[tuple[str, ...]] = ("attributes",)
    attempt_id: str = Field(min_length=1)
    sequence_id: int = Field(ge=0)  # 0 is stored, as the reference stores it; the counter then hands out 1
    # Any string, as the reference stores them; OpenTelemetry's hex ids are checked where a format requires them
    # (OTLP ingest, workers/otlp.py).
    trace_id: str
    span_id: str
    parent_id: str | None = None
    trace_state: str = ""
    name: str = Field(min_length=1)
    kind: Literal["INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"] = "INTERNAL"
    status_code: StatusCode = "UNSET"
    status_message: str | None = None
    start_time_ns: int = Field(ge=0)
    end_time_ns: int | None = Field(None, ge=0)
    attributes: dict[str, AttrValue] = Field(default_factory=dict)
    events: list[SpanEventRecord] = Field(default_factory=list)
    links: list[SpanLinkRecord] = Field(default_factory=list)
    resource: ResourceRecord = Field(default_factory=ResourceRecord)
    scope_name: str = ""
    scope_version: str = ""
    resources_id: str | None = None

    @model_validator(mode="after")
    def _ends_after_start(self) -> SpanRecorded:
        if self.end_time_ns is not None and self.end_time_ns < self.start_time_ns:
            raise ValueError("end_time_ns must not be before start_time_ns")
        return self


# --- Resources, triplets -----------------------------------------------------------------------------------


class NamedResourceRecord(AvroModel):
    json_fields = frozenset({"sampling_parameters"})
    resource_type: Literal["llm", "proxy_llm", "prompt_template"]
    endpoint: str | None = None
    model: str | None = None
    api_key: str | None = None
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)
    template: str | None = None
    engine: str | None = None
    version: int | None = None
    checkpoint: str | None = None


class KeyedByResources(AvroModel):
    """A record that is not rollout-scoped, keyed by a resources id, stamped by :meth:`EventFactory.stamp` (its
    Avro record begins with these fields, in this order)."""

    event_id: str
    resources_id: str = Field(min_length=1)
    producer_id: str
    producer_seq: int
    timestamp_ns: int

    @property
    def key(self) -> str:
        return self.resources_id


class ResourcesPublished(KeyedByResources):
    """A version of named resources."""

    avro_name: ClassVar[str] = "litstream.ResourcesPublished"
    version: int = Field(ge=1)
    create_time: float
    update_time: float
    resources: dict[str, NamedResourceRecord]


class TripletEmitted(Event):
    avro_name = "litstream.TripletEmitted"
    json_fields = frozenset({"metadata"})
    attempt_id: str
    group_id: str = Field(min_length=1)
    index: int = Field(ge=0)
    policy_version: str | None = None
    resources_id: str | None = None
    prompt_token_ids: list[int] = Field(default_factory=list)
    response_token_ids: list[int] = Field(default_factory=list)
    response_logprobs: list[float] = Field(default_factory=list)
    prompt_text: str = ""
    response_text: str = ""
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.group_id


class TrainedSample(AvroModel):
    """One sample a step trained on: the triplets ``index`` .. ``index + turns - 1`` of an attempt."""

    rollout_id: str
    attempt_id: str
    group_id: str
    index: int = Field(ge=0)
    turns: int = Field(1, ge=1)
    policy_version: int | None = None  # the version that generated them
    reward: float


class VersionTrained(KeyedByResources):
    """On ``lineage``, keyed by the version's resources id: what trained it."""

    avro_name: ClassVar[str] = "litstream.VersionTrained"
    run_id: str | None = None  # the training run
    version: int = Field(ge=1)  # N of policy-vN
    time: float
    window: str  # why the step's window closed: count, overflow, time, flush
    samples: list[TrainedSample]


# --- Derived records (written by processors) ---------------------------------------------------------------


class RolloutOffered(Event):
    avro_name = "litstream.RolloutOffered"
    json_fields = frozenset({"input", "metadata"})
    attempt_sequence: int = Field(ge=1)
    input: Any
    mode: RolloutMode | None = None
    resources_id: str | None = None
    config: AvroRolloutConfig = Field(default_factory=AvroRolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)


class AttemptSnapshot(AvroModel):
    json_fields = frozenset({"metadata"})
    attempt_id: str
    sequence_id: int
    start_time: float
    end_time: float | None = None
    status: AttemptStatus = "preparing"
    worker_id: str | None = None
    last_heartbeat_time: float | None = None
    error: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class RolloutSnapshot(AvroModel):
    avro_name: ClassVar[str] = "litstream.RolloutSnapshot"
    json_fields = frozenset({"input", "metadata"})
    rollout_id: str
    version: int
    input: Any
    start_time: float
    end_time: float | None = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    status: RolloutStatus
    config: AvroRolloutConfig = Field(default_factory=AvroRolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    attempts: list[AttemptSnapshot] = Field(default_factory=list)
    updated_ns: int
    last_event_id: str | None = None
    last_producer_id: str | None = None
    last_producer_seq: int | None = None
    last_accepted: bool = True
    last_reason: str | None = None
    next_sequence_id: int = 1
    last_reserved: int | None = None

    @property
    def key(self) -> str:
        return self.rollout_id


class WorkerObserved(AvroModel):
    """On ``workers``, keyed by worker id: a worker seen through its attempts and dequeues, or its own heartbeat."""

    avro_name: ClassVar[str] = "litstream.WorkerObserved"
    json_fields = frozenset({"heartbeat_stats"})
    event_id: str
    worker_id: str = Field(min_length=1)
    producer_id: str
    producer_seq: int
    timestamp_ns: int
    time: float
    kind: Literal["attempt", "dequeue", "empty_dequeue", "heartbeat"]
    status: Literal["idle", "busy", "unknown"] | None = None
    rollout_id: str | None = None
    attempt_id: str | None = None
    heartbeat_stats: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        return self.worker_id


TOP_LEVEL: tuple[type[AvroModel], ...] = (
    RolloutEnqueued, RolloutStatusChanged, AttemptStarted, AttemptHeartbeat, AttemptStatusChanged,
    RolloutUpdated, AttemptUpdated, SequenceRequested,
    SpanRecorded, ResourcesPublished, TripletEmitted, RolloutOffered, RolloutSnapshot, WorkerObserved,
    VersionTrained,
)
BY_NAME: dict[str, type[AvroModel]] = {cls.avro_name: cls for cls in TOP_LEVEL}  # type: ignore[attr-defined]


class EventFactory:
    """Stamps events with this producer's identity and a strictly increasing sequence.

    The sequence starts from the wall clock in microseconds, so a restarted producer that reuses its id still
    continues above what it wrote before.
    """

    def __init__(self, producer_id: str | None = None, role: str = "client", run_id: str | None = None) -> None:
        self.producer_id = producer_id or f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.run_id = run_id  # stamped on every rollout-scoped event
        self._last = 0
        self._lock = threading.Lock()

    def next_seq(self) -> int:
        with self._lock:
            self._last = max(self._last + 1, time.time_ns() // 1000)
            return self._last

    def stamp(self) -> dict[str, Any]:
        """Identity fields for records that are not rollout-scoped (resources, workers)."""
        return {"event_id": uuid.uuid4().hex, "producer_id": self.producer_id, "producer_seq": self.next_seq(),
                "timestamp_ns": time.time_ns()}

    def meta_record(self, rollout_id: str) -> dict[str, Any]:
        """:meth:`meta` as its Avro record, for producers that write records directly (the span exporter)."""
        return {"event_id": uuid.uuid4().hex, "rollout_id": rollout_id, "producer_id": self.producer_id,
                "producer_seq": self.next_seq(), "timestamp_ns": time.time_ns(), "run_id": self.run_id}

    def meta(self, rollout_id: str) -> EventMeta:
        return EventMeta(
            event_id=uuid.uuid4().hex,
            rollout_id=rollout_id,
            producer_id=self.producer_id,
            producer_seq=self.next_seq(),
            timestamp_ns=time.time_ns(),
            run_id=self.run_id,
        )
