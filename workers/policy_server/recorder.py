"""Every call the server answers becomes spans on the ``spans`` topic, with no code in the agent.

A call under ``/rollout/{rid}/attempt/{aid}/v1/...`` is checked against the rollout's latest snapshot (an
unknown attempt is refused with 404, an ended one with 409), gets its span sequence id reserved through the
rollout's partition (``LogWriter.reserve``, the Store API's ``get_next_span_sequence_id`` too: one trip, answered by
this process's replica of the fold), and keeps the
attempt alive with an ``AttemptHeartbeat`` (at most one a second per attempt, as the SDK), since spans alone do
not reach the lifecycle processor. A call on plain ``/v1/...`` belongs to no rollout: its span is recorded under
the reserved rollout and attempt id ``UNATTRIBUTED`` (queryable in ClickHouse like any span), which the triplet
processor skips, so it is never attributed to a rollout.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from litstream.infra.producer import EventProducer
from litstream.schemas.events import (
    AttemptHeartbeat,
    AttrValue,
    ResourceRecord,
    SpanRecorded,
)
from litstream.schemas.models import FINISHED
from litstream.schemas.policy_versions import UNATTRIBUTED
from litstream.streams.log_writer import LogWriter, StoreError
from litstream.streams.span_beats import SpanBeats

from ..attributes import check_span_attributes
from .openai_api import ApiError

log = logging.getLogger("litstream.policy_server")
ATTEMPT_LOOKUP_S = 5.0  # how long a call waits for the snapshot naming its attempt (the view may lag a claim)
RESERVE_WAIT_S = 10.0  # how long a reservation waits for the broker (the policy server's LogWriter's bound)
ENDED = frozenset({"succeeded", "failed", "timeout", "unresponsive"})


@dataclass(frozen=True)
class CallScope:
    """Where a call belongs: an attempt (with the resources id its rollout runs with) or nowhere."""

    rollout_id: str = UNATTRIBUTED
    attempt_id: str = UNATTRIBUTED
    resources_id: str | None = None

    @property
    def attributed(self) -> bool:
        return self.rollout_id != UNATTRIBUTED


@dataclass
class SpanDraft:
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, AttrValue]
    status_code: str = "OK"
    status_message: str | None = None


class SpanRecorder:
    def __init__(self, producer: EventProducer, log_writer: LogWriter | None, service_name: str) -> None:
        """``log_writer``: the rollouts' replica and the reservation of sequence ids (None: a server that follows
        no rollouts, started without a broker)."""
        self.producer = producer
        self.log = log_writer
        self.rollouts = log_writer.rollouts if log_writer is not None else None
        self.service_name = service_name
        self._lock = threading.Lock()
        self._local_seq = 0
        self._beats = SpanBeats()
        self._fallback_next: dict[str, int] = {}
        self.stats = {"spans": 0, "unattributed": 0, "reserve_fallbacks": 0, "heartbeats": 0}

    # -- scope ----------------------------------------------------------------------------------------------

    async def scope(self, rollout_id: str, attempt_id: str) -> CallScope:
        """The attempt a per-attempt path names, or an OpenAI-format error when it is not a running attempt."""
        if self.rollouts is None:
            raise ApiError(503, "this server does not follow rollouts (started without a broker)", "server_error")
        rollouts = self.rollouts

        def named() -> Any:
            snap = rollouts.snapshots.get(rollout_id)
            return snap if snap is not None and any(a.attempt_id == attempt_id for a in snap.attempts) else None

        snap = named() or await asyncio.to_thread(rollouts.wait_for, named, ATTEMPT_LOOKUP_S)
        if snap is None:
            raise ApiError(404, f"no attempt {attempt_id} of rollout {rollout_id}: call the URL the runner gave the "
                                "agent (the LLM resource's endpoint), or plain /v1/... for a call outside any attempt",
                           code="attempt_not_found")
        attempt = next(a for a in snap.attempts if a.attempt_id == attempt_id)
        if attempt.status in ENDED or snap.status in FINISHED:
            raise ApiError(409, f"attempt {attempt_id} of rollout {rollout_id} has ended ({attempt.status}); "
                                "its calls can no longer be recorded", code="attempt_ended")
        return CallScope(rollout_id, attempt_id, snap.resources_id)

    # -- sequence ids ---------------------------------------------------------------------------------------

    async def reserve(self, scope: CallScope, count: int) -> int:
        """The first of ``count`` span sequence ids for the call (strictly increasing per rollout)."""
        if not scope.attributed:
            with self._lock:
                self._local_seq = max(self._local_seq + count, time.time_ns() // 1000)
                return self._local_seq - count + 1
        assert self.log is not None and self.rollouts is not None
        try:
            (first,) = await self.log.reserve([(scope.rollout_id, scope.attempt_id, count)])
            return first
        except (StoreError, ValueError) as exc:
            # Not reserved (the broker did not take the request in time, or the fold refused it): choose ids past
            # the latest snapshot's counter and report them in the heartbeat, as the SDK does, so the counter
            # still moves past them.
            self.stats["reserve_fallbacks"] += 1
            log.warning("no sequence id reserved for %s (%s); choosing one", scope.rollout_id, exc)
        latest = self.rollouts.snapshots.get(scope.rollout_id)
        with self._lock:
            first = max(self._fallback_next.get(scope.rollout_id, 1), latest.next_sequence_id if latest else 1)
            self._fallback_next[scope.rollout_id] = first + count
        return first

    # -- recording ------------------------------------------------------------------------------------------

    def record(self, scope: CallScope, first_sequence_id: int, drafts: list[SpanDraft]) -> None:
        """Send the call's spans (one per choice), then a heartbeat for the attempt if one is due."""
        trace_id = secrets.token_hex(16)
        resource = ResourceRecord(attributes={"service.name": self.service_name,
                                              "agentlightning.rollout_id": scope.rollout_id,
                                              "agentlightning.attempt_id": scope.attempt_id})
        for offset, draft in enumerate(drafts):
            attributes = _within_limits(draft.attributes)
            span = SpanRecorded(
                meta=self.producer.factory.meta(scope.rollout_id), attempt_id=scope.attempt_id,
                sequence_id=first_sequence_id + offset, trace_id=trace_id, span_id=secrets.token_hex(8),
                parent_id=None, name=draft.name, kind="SERVER", status_code=draft.status_code,  # type: ignore[arg-type]
                status_message=draft.status_message, start_time_ns=draft.start_ns, end_time_ns=draft.end_ns,
                attributes=attributes, resource=resource, scope_name="litstream.policy_server",
                resources_id=scope.resources_id)
            self.producer.send(self.producer.topics.spans, span)
        self.stats["spans"] += len(drafts)
        if not scope.attributed:
            self.stats["unattributed"] += len(drafts)
            return
        self._beat(scope, first_sequence_id + len(drafts) - 1)

    def _beat(self, scope: CallScope, max_sequence_id: int) -> None:
        """The attempt's heartbeat, if ``span_beats`` says one is due (a held-back one goes with a later call)."""
        self._beats.spans(scope.rollout_id, scope.attempt_id, max_sequence_id)
        beat = self._beats.due_for(scope.rollout_id, scope.attempt_id)
        if beat is not None:
            self.stats["heartbeats"] += 1
            event = AttemptHeartbeat(meta=self.producer.factory.meta(scope.rollout_id), attempt_id=scope.attempt_id,
                                     time=time.time(), max_sequence_id=beat.max_sequence_id)
            # Through the log writer's delivery report: the replica folds its own writes as they are acknowledged.
            report = self.log.lifecycle_report(event, None) if self.log is not None else None
            self.producer.send(self.producer.topics.rollout_events, event, on_delivery=report)


def _within_limits(attributes: dict[str, AttrValue]) -> dict[str, AttrValue]:
    """The span's attributes; when the messages' text is over the per-span limits, the text goes (the token ids,
    which training needs, stay) and ``litstream.span.truncated`` says so."""
    try:
        check_span_attributes(attributes)
        return attributes
    except ValueError:
        kept: dict[str, AttrValue] = {k: v for k, v in attributes.items()
                                      if not (k.startswith(("gen_ai.prompt.", "gen_ai.completion."))
                                              and k.endswith(".content"))}
        kept["litstream.span.truncated"] = True
        return kept
