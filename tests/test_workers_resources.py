"""The pure folds of workers and resources."""

from __future__ import annotations

from litstream.schemas.events import EventFactory, ResourcesPublished, WorkerObserved
from litstream.schemas.models import LLM, PromptTemplate
from litstream.streams.resources import ResourcesState, apply_resources, to_records
from litstream.streams.worker_fold import apply_worker, worker_status_for

F = EventFactory(role="test")


def obs(kind: str, t: float, status: str | None = None, **kw: object) -> WorkerObserved:
    return WorkerObserved(**F.stamp(), worker_id="w", time=t, kind=kind, status=status, **kw)  # type: ignore[arg-type]


def test_worker_status_follows_its_attempts() -> None:
    assert [worker_status_for(s) for s in ("preparing", "running", "succeeded", "failed", "timeout",
                                           "unresponsive")] == ["busy", "busy", "idle", "idle", "unknown", "unknown"]
    w = apply_worker(None, obs("dequeue", 1.0, "busy", rollout_id="ro-1", attempt_id="at-1"))
    assert (w.status, w.current_rollout_id, w.last_dequeue_time, w.last_busy_time) == ("busy", "ro-1", 1.0, 1.0)
    w = apply_worker(w, obs("attempt", 2.0, "idle", rollout_id="ro-1", attempt_id="at-1"))
    assert (w.status, w.current_rollout_id, w.last_idle_time) == ("idle", None, 2.0)
    w = apply_worker(w, obs("attempt", 1.5, "busy", rollout_id="ro-0", attempt_id="at-0"))
    assert w.status == "idle"  # an older observation from another partition does not undo a newer one
    w = apply_worker(w, obs("heartbeat", 3.0, heartbeat_stats={"gpu": 1}))
    assert (w.status, w.last_heartbeat_time, w.heartbeat_stats) == ("idle", 3.0, {"gpu": 1})
    w = apply_worker(w, obs("heartbeat", 3.5))  # no stats: those reported before stay, as in the reference
    assert (w.last_heartbeat_time, w.heartbeat_stats) == (3.5, {"gpu": 1})
    w = apply_worker(w, obs("attempt", 4.0, "unknown", rollout_id="ro-2", attempt_id="at-2"))
    assert w.status == "unknown" and w.current_attempt_id is None


def test_empty_dequeue_makes_a_worker_idle() -> None:
    w = apply_worker(None, obs("empty_dequeue", 5.0))
    assert (w.status, w.last_idle_time, w.last_dequeue_time) == ("idle", 5.0, 5.0)


def publish(rid: str, t: float, **resources: object) -> ResourcesPublished:
    return ResourcesPublished(**F.stamp(), resources_id=rid, version=1, create_time=t, update_time=t,
                              resources=to_records(resources))  # type: ignore[arg-type]


def test_resources_versions_and_latest() -> None:
    state = ResourcesState()
    first = publish("rs-a", 1.0, llm=LLM(endpoint="http://x/v1", model="m", sampling_parameters={"t": 0.7}))
    assert apply_resources(state, first)
    assert not apply_resources(state, first)  # redelivery
    apply_resources(state, publish("rs-b", 2.0, prompt=PromptTemplate(template="{q}")))
    assert state.latest_id == "rs-b"
    apply_resources(state, publish("rs-a", 3.0, llm=LLM(endpoint="http://y/v1", model="m2")))
    a = state.by_id["rs-a"]
    assert (a.version, a.create_time, a.update_time, state.latest_id) == (2, 1.0, 3.0, "rs-a")
    llm = a.resources["llm"]
    assert isinstance(llm, LLM) and llm.endpoint == "http://y/v1"
    assert isinstance(state.by_id["rs-b"].resources["prompt"], PromptTemplate)
