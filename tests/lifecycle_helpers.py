"""Producing lifecycle events by hand and waiting on the live state, for the lifecycle tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.events import (
    AttemptHeartbeat,
    AttemptStarted,
    AttemptStatusChanged,
    RolloutSnapshot,
    SequenceRequested,
)
from litstream.schemas.models import RolloutConfig
from litstream.streams.stateview import StateView
from litstream.workers.client import enqueue_rollout


class Driver:
    """Plays the part of agents and workers, event by event."""

    def __init__(self, settings: Settings) -> None:
        self.events = EventProducer(settings, role="test")
        self.view = StateView(settings)

    def enqueue(self, task: object = None, **config: object) -> str:
        task = task if task is not None else {"a": 1, "b": 2, "op": "+"}
        rid = enqueue_rollout(self.events, task, config=RolloutConfig(**config)).rollout_id  # type: ignore[arg-type]
        self.events.flush()
        return rid

    def claim(self, rid: str, seq: int, attempt_id: str) -> str:
        ev = AttemptStarted(meta=self.events.factory.meta(rid), attempt_id=attempt_id, sequence_id=seq,
                            start_time=time.time(), worker_id="w-test")
        self.events.send(self.events.topics.rollout_events, ev)
        self.events.flush()
        return ev.meta.event_id

    def beat(self, rid: str, attempt_id: str) -> None:
        self.events.send(self.events.topics.rollout_events, AttemptHeartbeat(
            meta=self.events.factory.meta(rid), attempt_id=attempt_id, time=time.time()))
        self.events.flush()

    def reserve(self, rid: str, attempt_id: str, times: int) -> None:
        """``times`` reservations of one span sequence id each, as an agent makes one per span."""
        for _ in range(times):
            self.events.send(self.events.topics.rollout_events, SequenceRequested(
                meta=self.events.factory.meta(rid), attempt_id=attempt_id, count=1))
        self.events.flush()

    def finish(self, rid: str, attempt_id: str, status: str) -> None:
        self.events.send(self.events.topics.rollout_events, AttemptStatusChanged(
            meta=self.events.factory.meta(rid), attempt_id=attempt_id, status=status, time=time.time()))  # type: ignore[arg-type]
        self.events.flush()

    def wait(self, rid: str, pred: Callable[[RolloutSnapshot], bool], timeout: float = 60.0,
             while_waiting: Callable[[], None] | None = None) -> RolloutSnapshot:
        deadline = time.monotonic() + timeout
        snap = None
        while time.monotonic() < deadline:
            snap = self.view.catch_up().get(rid)
            if snap is not None and pred(snap):
                return snap
            if while_waiting:
                while_waiting()
            time.sleep(0.2)
        raise AssertionError(f"condition not reached in {timeout}s; last state: {snap}")

    def close(self) -> None:
        self.view.close()
        self.events.close()  # its connections go now, not whenever the object is collected
