"""Drives Agent Lightning 0.3.0's stock LightningStoreClient through the cases where its store's behaviour is
easy to get wrong: what a span does to its attempt, the queue's order, an attempt after success, updates of a
finished rollout, a requeued rollout dequeued at once, an attempt going unresponsive on its own, span ids that are
not OpenTelemetry hex, sequence id 0, and a worker heartbeat without stats.

Run with the Agent Lightning virtualenv's python: ``python agl_compat_cases_script.py URL`` against a server
(a litstream gateway), or ``python agl_compat_cases_script.py reference`` against Agent Lightning's own
``LightningStoreServer`` over ``InMemoryLightningStore``, started here with ``scan_debounce_seconds=0`` (its health
check runs on every call, so its timers are as prompt as they can be; no other case has one). Prints one JSON
object of observations (the same keys either way) for tests/test_agl_compat.py to compare.
"""

import asyncio
import json
import socket
import sys
import time

N_ONE_BY_ONE = 6
N_MANY = 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _dequeue(client, worker_id: str):
    """The next rollout on offer (a gateway may need a moment to see an offer made elsewhere)."""
    for _ in range(100):
        got = await client.dequeue_rollout(worker_id=worker_id)
        if got is not None:
            return got
        await asyncio.sleep(0.1)
    raise RuntimeError("nothing to dequeue")


def _span(rollout_id: str, attempt_id: str, sequence_id: int, trace_id: str, span_id: str, parent_id, name: str):
    from agentlightning.types import Span, TraceStatus
    from agentlightning.types.tracer import OtelResource

    now = time.time()
    return Span(rollout_id=rollout_id, attempt_id=attempt_id, sequence_id=sequence_id, trace_id=trace_id,
                span_id=span_id, parent_id=parent_id, name=name, status=TraceStatus(status_code="OK"),
                attributes={}, events=[], links=[], start_time=now, end_time=now, context=None, parent=None,
                resource=OtelResource(attributes={}, schema_url=""))


async def _attempt_view(client, rollout_id: str) -> dict:
    latest = await client.get_latest_attempt(rollout_id)
    rollout = await client.get_rollout_by_id(rollout_id)
    return {"attempt": latest.status, "heartbeat": latest.last_heartbeat_time is not None,
            "rollout": rollout.status}


async def spans_beat(client) -> dict:
    """A span is a heartbeat: it starts a preparing attempt, revives an unresponsive one, leaves a timed-out one."""
    from agentlightning.types import RolloutConfig

    out: dict = {}
    # preparing -> running, and its rollout with it
    ro = await client.enqueue_rollout(input={"case": "preparing"})
    claimed = await _dequeue(client, "w-beat")
    assert claimed.rollout_id == ro.rollout_id, "another rollout was on offer"
    aid = claimed.attempt.attempt_id
    out["preparing_before"] = await _attempt_view(client, ro.rollout_id)
    seq = await client.get_next_span_sequence_id(ro.rollout_id, aid)
    await client.add_span(_span(ro.rollout_id, aid, seq, "1" * 32, "2" * 16, None, "first"))
    out["preparing_after_span"] = await _attempt_view(client, ro.rollout_id)

    # unresponsive (a retry pending) -> running again, and its rollout
    ro = await client.enqueue_rollout(input={"case": "unresponsive"},
                                      config=RolloutConfig(max_attempts=2, retry_condition=["unresponsive"]))
    claimed = await _dequeue(client, "w-beat")
    aid = claimed.attempt.attempt_id
    await client.update_attempt(ro.rollout_id, aid, status="unresponsive")  # as the health check would
    out["unresponsive_before"] = await _attempt_view(client, ro.rollout_id)
    await client.add_span(_span(ro.rollout_id, aid, 1, "3" * 32, "4" * 16, None, "late"))
    out["unresponsive_after_span"] = await _attempt_view(client, ro.rollout_id)
    again = await client.dequeue_rollout(worker_id="w-other")  # the revived rollout is no longer on offer
    out["revived_not_dequeued"] = again is None or again.rollout_id != ro.rollout_id

    # timeout stays timeout, the heartbeat is recorded
    ro = await client.enqueue_rollout(input={"case": "timeout"})
    claimed = await _dequeue(client, "w-beat")
    aid = claimed.attempt.attempt_id
    await client.update_attempt(ro.rollout_id, aid, status="timeout")
    out["timeout_before"] = await _attempt_view(client, ro.rollout_id)
    await client.add_span(_span(ro.rollout_id, aid, 1, "5" * 32, "6" * 16, None, "after timeout"))
    out["timeout_after_span"] = await _attempt_view(client, ro.rollout_id)
    return out


async def differences(client) -> dict:
    """Where litstream differs on purpose (docs/agl-and-otlp.md): a span on an unresponsive attempt of a failed rollout,
    and on a timed-out attempt whose rollout waits for its retry."""
    from agentlightning.types import RolloutConfig

    out: dict = {}
    for case, config, status in (("unresponsive_failed", RolloutConfig(), "unresponsive"),
                                 ("timeout_requeuing", RolloutConfig(max_attempts=2, retry_condition=["timeout"]),
                                  "timeout")):
        ro = await client.enqueue_rollout(input={"case": case}, config=config)
        claimed = await _dequeue(client, "w-diff")
        aid = claimed.attempt.attempt_id
        await client.update_attempt(ro.rollout_id, aid, status=status)
        await client.add_span(_span(ro.rollout_id, aid, 1, "7" * 32, "8" * 16, None, "late"))
        out[case] = await _attempt_view(client, ro.rollout_id)
        if case == "timeout_requeuing":  # take its retry (or whatever else is on offer) off the queue
            await client.dequeue_rollout(worker_id="w-diff")
    return out


async def fifo(client) -> dict:
    """Rollouts enqueued one after another, then in one enqueue_many, are dequeued in that order."""
    from agentlightning.types import EnqueueRolloutRequest

    order = [(await client.enqueue_rollout(input={"fifo": i})).rollout_id for i in range(N_ONE_BY_ONE)]
    many = await client.enqueue_many_rollouts([EnqueueRolloutRequest(input={"fifo": N_ONE_BY_ONE + i})
                                               for i in range(N_MANY)])
    order += [r.rollout_id for r in many]
    got = [(await _dequeue(client, "w-fifo")).rollout_id for _ in order]
    return {"dequeued_in_enqueue_order": got == order, "same_rollouts": sorted(got) == sorted(order),
            "positions": [order.index(r) if r in order else -1 for r in got]}


async def attempt_after_success(client) -> dict:
    """start_attempt on a succeeded rollout: the rollout follows its newest attempt."""
    ro = await client.enqueue_rollout(input={"case": "again"})
    claimed = await _dequeue(client, "w-again")
    await client.update_attempt(ro.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    out: dict = {"before": (await client.get_rollout_by_id(ro.rollout_id)).status}
    try:
        again = await client.start_attempt(ro.rollout_id, worker_id="w-again-2")
    except Exception as exc:  # a 4xx: the client raises at once
        out["start_attempt"] = f"refused: {exc}"
        return out
    out["start_attempt"] = [again.status, again.attempt.status, again.attempt.sequence_id]
    got = await client.get_rollout_by_id(ro.rollout_id)
    out["rollout_after_start"] = [got.status, got.attempt.attempt_id == again.attempt.attempt_id]
    att = await client.update_attempt(ro.rollout_id, again.attempt.attempt_id, status="failed")
    out["new_attempt_failed"] = [att.status, (await client.get_rollout_by_id(ro.rollout_id)).status]
    out["attempts"] = [a.status for a in await client.query_attempts(ro.rollout_id)]
    return out


async def _refused_or(call) -> object:
    try:
        return (await call).status
    except Exception as exc:  # a 4xx: the client raises at once
        return f"refused: {exc}"


async def finished_updates(client) -> dict:
    """update_rollout / update_attempt of a finished rollout: its own status again is a no-op (the stock flow:
    the attempt succeeded, then the rollout), another status is taken, and the rollout follows its newest
    attempt, even when that attempt's status does not change."""
    ro = await client.enqueue_rollout(input={"case": "finished"})
    claimed = await _dequeue(client, "w-finished")
    rid, aid = ro.rollout_id, claimed.attempt.attempt_id

    async def rollout_status() -> str:
        return (await client.get_rollout_by_id(rid)).status

    out: dict = {"attempt_succeeded": await _refused_or(client.update_attempt(rid, "latest", status="succeeded"))}
    out["rollout_succeeded_again"] = await _refused_or(client.update_rollout(rid, status="succeeded"))
    out["rollout_failed"] = await _refused_or(client.update_rollout(rid, status="failed"))
    out["attempt_succeeded_again"] = [await _refused_or(client.update_attempt(rid, aid, status="succeeded")),
                                      await rollout_status()]
    out["attempt_running"] = [await _refused_or(client.update_attempt(rid, "latest", status="running")),
                              await rollout_status()]
    out["attempt_failed"] = [await _refused_or(client.update_attempt(rid, aid, status="failed")),
                             await rollout_status()]
    out["attempts"] = [a.status for a in await client.query_attempts(rid)]
    return out


async def requeued_dequeued(client) -> dict:
    """A rollout put back on the queue by update_rollout(status="requeuing"), running or finished, is handed out by
    the very next dequeue (no waiting: a caller reads its own writes on the queue), with its next attempt."""
    out: dict = {}
    for case in ("running", "succeeded"):
        ro = await client.enqueue_rollout(input={"case": f"requeued {case}"})
        claimed = await _dequeue(client, "w-requeue")
        if case == "succeeded":
            await client.update_attempt(ro.rollout_id, claimed.attempt.attempt_id, status="succeeded")
        status = await _refused_or(client.update_rollout(ro.rollout_id, status="requeuing"))
        again = await client.dequeue_rollout(worker_id="w-requeue")
        out[case] = [status, None if again is None else [again.rollout_id == ro.rollout_id, again.status,
                                                         again.attempt.sequence_id, again.attempt.status]]
    return out


async def unresponsive_revived(client) -> dict:
    """A span revives an attempt update_attempt marked unresponsive while its rollout runs: an older attempt
    under a newer one, and an attempt whose rollout was set running again after it failed."""
    out: dict = {}
    ro = await client.enqueue_rollout(input={"case": "older attempt"})
    first = (await _dequeue(client, "w-revive")).attempt.attempt_id
    await client.start_attempt(ro.rollout_id, worker_id="w-revive-2")
    await client.update_attempt(ro.rollout_id, first, status="unresponsive")
    await client.add_span(_span(ro.rollout_id, first, 1, "a" * 32, "b" * 16, None, "late"))
    attempts = await client.query_attempts(ro.rollout_id)
    out["older_attempt"] = [(a.status, a.last_heartbeat_time is not None) for a in attempts]
    out["older_attempt_rollout"] = (await client.get_rollout_by_id(ro.rollout_id)).status

    ro = await client.enqueue_rollout(input={"case": "set running again"})
    aid = (await _dequeue(client, "w-revive")).attempt.attempt_id
    await client.update_attempt(ro.rollout_id, aid, status="unresponsive")
    out["failed"] = await _attempt_view(client, ro.rollout_id)
    await client.update_rollout(ro.rollout_id, status="running")
    out["running_again"] = await _attempt_view(client, ro.rollout_id)
    await client.add_span(_span(ro.rollout_id, aid, 1, "c" * 32, "d" * 16, None, "late"))
    out["after_span"] = await _attempt_view(client, ro.rollout_id)
    return out


async def unresponsive_on_its_own(client) -> dict:
    """An attempt with unresponsive_seconds=0.2 and no retry condition: 0.25 s after its last heartbeat (a span)
    it is unresponsive and its rollout failed, with nobody calling meanwhile. ``on_time`` is what was read at
    0.25 s (timing: the test compares it only for the reference, whose check runs at the call); ``settled`` what
    is read once it changed (or after 30 s)."""
    from agentlightning.types import RolloutConfig

    ro = await client.enqueue_rollout(input={"case": "unresponsive timer"},
                                      config=RolloutConfig(unresponsive_seconds=0.2))
    aid = (await _dequeue(client, "w-timer")).attempt.attempt_id
    await client.add_span(_span(ro.rollout_id, aid, 1, "e" * 32, "f" * 16, None, "one"))
    beat = (await client.get_latest_attempt(ro.rollout_id)).last_heartbeat_time or time.time()
    await asyncio.sleep(max(0.0, beat + 0.25 - time.time()))
    out: dict = {"on_time": await _attempt_view(client, ro.rollout_id)}
    settled, give_up = out["on_time"], time.time() + 30
    while settled["attempt"] == "running" and time.time() < give_up:
        await asyncio.sleep(0.05)
        settled = await _attempt_view(client, ro.rollout_id)
    out["settled"] = settled
    return out


async def span_ids_and_zero(client) -> dict:
    """Trace and span ids that are any string, and a span with sequence id 0."""
    ro = await client.start_rollout(input={"case": "ids"}, worker_id="w-ids")
    rid, aid = ro.rollout_id, ro.attempt.attempt_id
    out: dict = {}
    try:
        added = await client.add_span(_span(rid, aid, 0, "trace-one", "span:1", "parent/x", "zero"))
        out["free_ids_added"] = added is not None and [added.trace_id, added.span_id, added.parent_id]
    except Exception as exc:
        out["free_ids_added"] = f"refused: {exc}"
    out["next_after_zero"] = await client.get_next_span_sequence_id(rid, aid)
    spans = await client.query_spans(rid)
    out["stored"] = sorted([s.sequence_id, s.trace_id, s.span_id, s.parent_id] for s in spans)
    out["by_trace"] = len(await client.query_spans(rid, trace_id="trace-one"))
    out["by_parent"] = len(await client.query_spans(rid, parent_id="parent/x"))
    return out


async def worker_stats_kept(client) -> dict:
    """update_worker without heartbeat_stats keeps the stats given before."""
    first = await client.update_worker("w-stats", heartbeat_stats={"gpu": 0.25})
    later = await client.update_worker("w-stats")
    got = await client.get_worker_by_id("w-stats")
    return {"first": first.heartbeat_stats, "after_plain_heartbeat": later.heartbeat_stats,
            "read_back": got.heartbeat_stats,
            "heartbeat_moved": later.last_heartbeat_time >= first.last_heartbeat_time}


async def run(url: str) -> dict:
    from agentlightning.store.client_server import LightningStoreClient

    client = LightningStoreClient(url, retry_delays=(0.5,), health_retry_delays=(0.1,))
    out: dict = {}
    try:
        out["fifo"] = await fifo(client)  # first: the queue starts empty
        out["spans_beat"] = await spans_beat(client)
        out["attempt_after_success"] = await attempt_after_success(client)
        out["finished_updates"] = await finished_updates(client)
        out["requeued_dequeued"] = await requeued_dequeued(client)
        out["unresponsive_revived"] = await unresponsive_revived(client)
        out["unresponsive_on_its_own"] = await unresponsive_on_its_own(client)
        out["span_ids_and_zero"] = await span_ids_and_zero(client)
        out["worker_stats"] = await worker_stats_kept(client)
        out["differences"] = await differences(client)
    finally:
        await client.close()
    return out


async def main(target: str) -> dict:
    if target != "reference":
        return await run(target)
    from agentlightning.store.client_server import LightningStoreServer
    from agentlightning.store.memory import InMemoryLightningStore

    server = LightningStoreServer(InMemoryLightningStore(scan_debounce_seconds=0), host="127.0.0.1", port=_free_port(),
                                  launch_mode="thread")
    await server.start()
    try:
        return await run(server.endpoint)
    finally:
        await server.stop()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
