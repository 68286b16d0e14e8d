"""The reference data model (Agent Lightning 0.3): rollouts, attempts, spans, resources, workers, triplets.

Field names, types and defaults follow the reference so that its clients and adapters read litstream's
objects unchanged. Times are epoch seconds (floats), as in the reference.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Generic, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

RolloutStatus = Literal["queuing", "preparing", "running", "failed", "succeeded", "cancelled", "requeuing"]
AttemptStatus = Literal["preparing", "running", "failed", "succeeded", "unresponsive", "timeout"]
RolloutMode = Literal["train", "val", "test"]
WorkerStatus = Literal["idle", "busy", "unknown"]
StatusCode = Literal["UNSET", "OK", "ERROR"]

ROLLOUT_STATUSES: tuple[str, ...] = RolloutStatus.__args__  # type: ignore[attr-defined]
ATTEMPT_STATUSES: tuple[str, ...] = AttemptStatus.__args__  # type: ignore[attr-defined]
QUEUING: frozenset[str] = frozenset({"queuing", "requeuing"})
RUNNING: frozenset[str] = frozenset({"preparing", "running"})
FINISHED: frozenset[str] = frozenset({"failed", "succeeded", "cancelled"})


def generate_id(n: int) -> str:
    return hashlib.sha1(uuid.uuid4().bytes).hexdigest()[:n]


def new_rollout_id() -> str:
    return "ro-" + generate_id(12)


def new_run_id() -> str:
    """A training run's id: when it started (UTC, to the second) and a random part."""
    return time.strftime("run-%Y%m%dT%H%M%SZ-", time.gmtime()) + generate_id(6)


def new_attempt_id() -> str:
    return "at-" + generate_id(8)


def new_resources_id() -> str:
    return "rs-" + generate_id(12)


class RolloutConfig(BaseModel):
    timeout_seconds: float | None = Field(None, gt=0)
    unresponsive_seconds: float | None = Field(None, gt=0)
    max_attempts: int = Field(1, ge=1)
    retry_condition: list[AttemptStatus] = Field(default_factory=list)


class Rollout(BaseModel):
    rollout_id: str
    input: Any
    start_time: float
    end_time: float | None = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    status: RolloutStatus = "queuing"
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] | None = None


class Attempt(BaseModel):
    rollout_id: str
    attempt_id: str
    sequence_id: int
    start_time: float
    end_time: float | None = None
    status: AttemptStatus = "preparing"
    worker_id: str | None = None
    last_heartbeat_time: float | None = None
    metadata: dict[str, Any] | None = None


class AttemptedRollout(Rollout):
    attempt: Attempt

    @model_validator(mode="after")
    def _same_rollout(self) -> AttemptedRollout:
        if self.attempt.rollout_id != self.rollout_id:
            raise ValueError("attempt.rollout_id must equal rollout_id")
        return self


class EnqueueRolloutRequest(BaseModel):
    input: Any
    mode: RolloutMode | None = None
    resources_id: str | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None


class Worker(BaseModel):
    worker_id: str
    status: WorkerStatus = "unknown"
    heartbeat_stats: dict[str, Any] | None = None
    last_heartbeat_time: float | None = None
    last_dequeue_time: float | None = None
    last_busy_time: float | None = None
    last_idle_time: float | None = None
    current_rollout_id: str | None = None
    current_attempt_id: str | None = None


T = TypeVar("T")


class PaginatedResult(BaseModel, Generic[T]):
    items: Sequence[T]
    limit: int
    offset: int
    total: int


# --- Spans (OpenTelemetry-shaped) -------------------------------------------------------------------------

AttributeValue = Union[str, bool, int, float, Sequence[Union[str, bool, int, float, None]], None]


class TraceStatus(BaseModel):
    model_config = ConfigDict(extra="allow")
    status_code: StatusCode = "UNSET"
    description: str | None = None


class SpanContext(BaseModel):
    trace_id: str
    span_id: str
    is_remote: bool = False
    trace_state: dict[str, str] = Field(default_factory=dict)


class Event(BaseModel):
    name: str
    attributes: dict[str, AttributeValue] = Field(default_factory=dict)
    timestamp: float | None = None


class Link(BaseModel):
    context: SpanContext
    attributes: dict[str, AttributeValue] | None = None


class OtelResource(BaseModel):
    attributes: dict[str, AttributeValue] = Field(default_factory=dict)
    schema_url: str = ""


def convert_timestamp(value: float | int | None) -> float | None:
    """Seconds, whatever came in: values above 1e12 are taken as nanoseconds (the reference's rule)."""
    if value is None:
        return None
    return value / 1e9 if value > 1e12 else float(value)


class Span(BaseModel):
    model_config = ConfigDict(extra="allow")

    rollout_id: str
    attempt_id: str
    sequence_id: int
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    status: TraceStatus = Field(default_factory=TraceStatus)
    attributes: dict[str, AttributeValue] = Field(default_factory=dict)
    events: list[Event] = Field(default_factory=list)
    links: list[Link] = Field(default_factory=list)
    start_time: float | None
    end_time: float | None
    context: SpanContext | None = None
    parent: SpanContext | None = None
    resource: OtelResource = Field(default_factory=OtelResource)

    @field_validator("start_time", "end_time", mode="before")
    @classmethod
    def _seconds(cls, v: Any) -> Any:
        return convert_timestamp(v) if isinstance(v, (int, float)) else v


# --- Resources --------------------------------------------------------------------------------------------


class LLM(BaseModel):
    resource_type: Literal["llm"] = "llm"
    endpoint: str
    model: str
    api_key: str | None = None
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)
    # A trained policy's publication also says which version it is and where its weights are (litstream's own
    # fields; clients of the reference API ignore them).
    version: int | None = None
    checkpoint: str | None = None

    def get_base_url(self) -> str:
        return self.endpoint


class ProxyLLM(BaseModel):
    resource_type: Literal["proxy_llm"] = "proxy_llm"
    endpoint: str
    model: str
    api_key: str | None = None
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)

    def get_base_url(self, rollout_id: str, attempt_id: str) -> str:
        base = self.endpoint.rstrip("/")
        had_v1 = base.endswith("/v1")
        if had_v1:
            base = base[: -len("/v1")]
        url = f"{base}/rollout/{rollout_id}/attempt/{attempt_id}"
        return url + "/v1" if had_v1 else url


class PromptTemplate(BaseModel):
    resource_type: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["jinja", "f-string", "poml"] = "f-string"

    def format(self, **kwargs: Any) -> str:
        if self.engine != "f-string":
            raise ValueError(f"only f-string templates format in-process, not {self.engine!r}")
        return self.template.format(**kwargs)


Resource = Annotated[Union[LLM, ProxyLLM, PromptTemplate], Field(discriminator="resource_type")]
NamedResources = dict[str, Resource]


class ResourcesUpdate(BaseModel):
    resources_id: str
    create_time: float
    update_time: float
    version: int
    resources: NamedResources


class Triplet(BaseModel):
    prompt: Any
    response: Any
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


# --- lineage (docs/history.md): what trained a policy version, and what became of a rollout ---------------------


class TrainedTriplet(BaseModel):
    """A triplet a version trained on: where it came from, the version that generated it, its reward."""

    rollout_id: str
    attempt_id: str
    index: int
    generated_by: int | None  # the policy version that generated it
    staleness: int | None  # versions between that one and the version it trained
    reward: float


class VersionLineage(BaseModel):
    """What trained ``version``: its triplets grouped by task (the GRPO group)."""

    version: int
    triplets: int
    tasks: dict[str, list[TrainedTriplet]]


class LlmCallVersion(BaseModel):
    attempt_id: str
    sequence_id: int
    span_name: str
    served_by: int | None  # the policy version that answered the call


class TripletLineage(BaseModel):
    attempt_id: str
    index: int
    generated_by: int | None
    reward: float | None
    trained_into: list[int]  # the versions whose steps took it (empty: none yet)


class RolloutLineage(BaseModel):
    """The policy version behind each LLM call of a rollout, and the versions its triplets went into."""

    rollout_id: str
    calls: list[LlmCallVersion]
    triplets: list[TripletLineage]
