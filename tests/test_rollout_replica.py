"""The store's replica of the fold against a real broker: a bounded replica (a runner's) recalls a finished rollout
it let go of when an update reopens it, so it answers that rollout's claims as the processor does."""

from __future__ import annotations

import asyncio
import random

from litstream.infra.settings import Settings
from litstream.schemas.models import FINISHED
from litstream.streams.rollout_replica import NewestFinished, RolloutReplica
from litstream.workers.store import LitStore


def test_the_finished_rollouts_held_are_the_last_to_finish_whatever_order_they_are_folded_in() -> None:
    """Two partitions read one after the other fold finishes out of time order: the held set is still the ``keep``
    latest by finish time (then id), a reopened rollout is held whatever its age, and one finished again counts
    from its new time."""
    finishes = {f"r{n}": 1_000 + 10 * n for n in range(20)}
    for seed in range(20):
        order = list(finishes.items())
        random.Random(seed).shuffle(order)
        window, gone = NewestFinished(keep=3), set()
        for rid, ns in order:
            gone.update(window.hold(rid, ns))
        assert sorted(set(finishes) - gone) == ["r17", "r18", "r19"] and len(gone) == 17

    window = NewestFinished(keep=2)
    assert window.hold("a", 10) == [] and window.hold("b", 20) == []
    assert window.hold("a", None) == []  # reopened: no longer among the finished
    assert window.hold("c", 30) == [] and window.hold("d", 40) == ["b"]
    assert window.hold("a", 50) == ["c"]  # finished again, later than c
    assert window.hold("e", 40) == ["d"]  # a tie in time: the smaller id goes first
    for n in range(500):  # reopened and finished again often: its stale entries are dropped, the rest stays right
        assert window.hold("a", None) == [] and window.hold("a", 60 + n) == []
    assert window.hold("f", 10_000) == ["e"] and window.hold("g", 10_001) == ["a"]


def test_a_bounded_replica_recalls_a_finished_rollout_an_update_reopens(settings: Settings) -> None:
    """keep_finished=1: of two finished rollouts the older is let go of. update_rollout(status="requeuing") puts it
    back on the queue (the reference's contract): the replica folds it again from its partition, then the requeue
    and the claim of its second attempt, and holds what the store's unbounded replica holds."""

    async def scenario() -> None:
        store = LitStore(settings)
        bounded = RolloutReplica(settings, store.codec, keep_finished=1)

        def folded(rollout_id: str, attempts: int, finished: bool) -> bool | None:
            state = bounded.states.get(rollout_id)
            return True if (state is not None and len(state.attempts) == attempts
                            and (state.status in FINISHED) == finished) else None

        try:
            done = []
            for n in range(2):  # one at a time: "older" is the replica's fold order
                ro = await store.start_rollout({"n": n})
                await store.update_attempt(ro.rollout_id, ro.attempt.attempt_id, status="succeeded")
                assert bounded.wait_for(lambda rid=ro.rollout_id: folded(rid, 1, True), 30)
                done.append(ro.rollout_id)
            old = done[0]
            assert old not in bounded.states and done[1] in bounded.states  # let go of

            requeued = await store.update_rollout(old, status="requeuing")
            assert requeued.status == "requeuing"
            assert bounded.wait_for(lambda: folded(old, 1, False), 30)
            assert bounded.states[old] == store.rollouts.states[old]

            claimed = await store.dequeue_rollout(worker_id="w-recall")  # its own requeue: on offer here at once
            assert claimed is not None and claimed.rollout_id == old and claimed.attempt.sequence_id == 2
            assert bounded.wait_for(lambda: folded(old, 2, False), 30)
            assert bounded.states[old] == store.rollouts.states[old]
            assert bounded.snapshots[old].attempts[-1].attempt_id == claimed.attempt.attempt_id
        finally:
            bounded.close()
            await store.close()

    asyncio.run(scenario())
