"""The store's replica of the fold against a real broker: a bounded replica (a runner's) recalls a finished rollout
it let go of when an update reopens it, so it answers that rollout's claims as the processor does."""

from __future__ import annotations

import asyncio

from litstream.infra.settings import Settings
from litstream.schemas.models import FINISHED
from litstream.streams.rollout_replica import RolloutReplica
from litstream.workers.store import LitStore


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
