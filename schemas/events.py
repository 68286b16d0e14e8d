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
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, model_validator
from pydantic_core import from_json

from .models import AttemptStatus, RolloutConfig, RolloutMode, RolloutStatus, StatusCode

M = TypeVar("M", bound=BaseModel)
AttrValue = bool | int | float | str | list[bool | int | float | str | None] | None


# Compact JSON, as json.dumps(separators=(",", ":"), ensure_ascii=False) gives it; one encoder made once (dumps
# with arguments builds a new one per call, half of its time for a small value).
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


# Values that came from a validated model or from the log: validated again by pydantic-core (types, bounds), but
# their JSON fields are not encoded again to check that they are JSON (they were, or were parsed from JSON).
VALID_JSON: dict[str, bool] = {"valid_json": True}


def _json_serialisable(value: Any, info: ValidationInfo) -> Any:
    if info.context is not VALID_JSON:
        try:
            _dumps(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"field {info.field_name!r} must be JSON-serialisable: {exc}") from None
    return value


_JSON_CHECK = AfterValidator(_json_serialisable)
# A field of free-form JSON: on the wire the string field ``<name>_json``.
JsonAny = Annotated[Any, _JSON_CHECK]
JsonObject = Annotated[dict[str, Any], _JSON_CHECK]
OptionalJsonObject = Annotated[dict[str, Any] | None, _JSON_CHECK]


class AvroModel(BaseModel):
    """A pydantic model that is one Avro record. Its JSON fields (:data:`JsonAny`, :data:`JsonObject`) are found
    from their annotations: ``json_fields``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    json_fields: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.json_fields = frozenset(name for name, f in cls.model_fields.items()
                                    if any(m is _JSON_CHECK for m in f.metadata))

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
    def rebuilt(cls, **fields: Any) -> Self:
        """The model of values taken from validated models (:func:`rebuilt`)."""
        return rebuilt(cls, fields)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Self:
        """The model of a record the codec decoded: its JSON fields parsed, then validated by pydantic-core in
        strict mode (Avro gives each value its exact type; no JSON field is encoded again to check it: it was just
        parsed). Raises ValueError when a JSON field is not JSON, pydantic's ValidationError when a value does
        not fit the model."""
        return cls.model_validate(_plan_of(cls).parsed(record), strict=True, context=VALID_JSON)


def rebuilt(cls: type[M], fields: dict[str, Any]) -> M:
    """``cls(**fields)`` for values taken from validated models (a snapshot from the fold's state, the reference's
    ``Rollout`` from a snapshot): validated by pydantic-core, which costs less than building the model in Python,
    without encoding the JSON fields again."""
    return cls.model_validate(fields, context=VALID_JSON)


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

    def parsed(self, value: Any) -> Any:
        return self._each(value, self.plan.parsed)

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
        self._parses: bool | None = None
        self._tags: bool | None = None

    @property
    def parses(self) -> bool:
        """Whether a record of this class holds a JSON field, at any depth (on first use, as nested plans)."""
        if self._parses is None:
            self._parses = bool(self.json_fields) or any(n.plan.parses for _, n in self.nested_items)
        return self._parses

    @property
    def tags(self) -> bool:
        """Whether a record of this class holds attribute values to tag, at any depth (on first use)."""
        if self._tags is None:
            self._tags = bool(self.attr_fields) or any(n.plan.tags for _, n in self.nested_items)
        return self._tags

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
        their union branch, in new dicts (the record, whose parts may be shared, is not changed). A record with no
        attribute values at any depth is the record itself."""
        if not self.tags:
            return record
        data = dict(record)
        for name in self.attr_fields:
            if data.get(name) is not None:
                data[name] = tagged_attributes(data[name])
        for name, nested in self.nested_items:
            if name in data:
                data[name] = nested.tagged(data[name])
        return data

    def parsed(self, record: dict[str, Any]) -> dict[str, Any]:
        """An Avro record as the model's fields: each JSON field parsed (a JSON field written as null by another
        version of the schema takes the model's default), nested records likewise (in place on the record)."""
        if not self.parses:
            return record
        for name, default in self.json_defaults.items():
            raw = record.pop(f"{name}_json", None)
            record[name] = from_json(raw) if raw is not None else default
        for name, nested in self.nested_items:
            if name in record:
                record[name] = nested.parsed(record[name])
        return record


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
    input: JsonAny
    start_time: float
    mode: RolloutMode | None = None
    resources_id: str | None = None
    config: AvroRolloutConfig = Field(default_factory=AvroRolloutConfig)
    metadata: JsonObject = Field(default_factory=dict)
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
    time: float
    set_fields: list[str]
    status: RolloutStatus | None = None
    input: JsonAny = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    config: AvroRolloutConfig | None = None
    metadata: OptionalJsonObject = None

    @model_validator(mode="after")
    def _known_fields(self) -> RolloutUpdated:
        unknown = set(self.set_fields) - ROLLOUT_FIELDS
        if unknown:
            raise ValueError(f"set_fields: unknown rollout fields {sorted(unknown)}")
        return self


class AttemptUpdated(Event):
    """update_attempt: the fields in ``set_fields`` change."""

    avro_name = "litstream.AttemptUpdated"
    attempt_id: str = Field(min_length=1)
    time: float
    set_fields: list[str]
    status: AttemptStatus | None = None
    worker_id: str | None = None
    last_heartbeat_time: float | None = None
    metadata: OptionalJsonObject = None

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
    resource_type: Literal["llm", "proxy_llm", "prompt_template"]
    endpoint: str | None = None
    model: str | None = None
    api_key: str | None = None
    sampling_parameters: JsonObject = Field(default_factory=dict)
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
    metadata: JsonObject = Field(default_factory=dict)

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
    attempt_sequence: int = Field(ge=1)
    input: JsonAny
    mode: RolloutMode | None = None
    resources_id: str | None = None
    config: AvroRolloutConfig = Field(default_factory=AvroRolloutConfig)
    metadata: JsonObject = Field(default_factory=dict)


class AttemptSnapshot(AvroModel):
    attempt_id: str
    sequence_id: int
    start_time: float
    end_time: float | None = None
    status: AttemptStatus = "preparing"
    worker_id: str | None = None
    last_heartbeat_time: float | None = None
    error: str | None = None
    metadata: JsonObject = Field(default_factory=dict)


class RolloutSnapshot(AvroModel):
    avro_name: ClassVar[str] = "litstream.RolloutSnapshot"
    rollout_id: str
    version: int
    input: JsonAny
    start_time: float
    end_time: float | None = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    status: RolloutStatus
    config: AvroRolloutConfig = Field(default_factory=AvroRolloutConfig)
    metadata: JsonObject = Field(default_factory=dict)
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
    heartbeat_stats: OptionalJsonObject = None

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
