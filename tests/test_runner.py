"""The runner with LitAgent-style agents on the real pipeline: classes and functions, sync and async, resources
picked up as they are published, failures recorded and retried, a stop that releases in-flight attempts."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from litstream.infra.kafka import read_to_end
from litstream.infra.settings import Settings
from litstream.schemas.codec import Codec
from litstream.schemas.events import SpanRecorded
from litstream.schemas.models import FINISHED, LLM, AttemptedRollout, NamedResources, ProxyLLM, RolloutConfig
from litstream.streams.rollout_replica import RolloutReplica
from litstream.workers.agent import LitAgent, as_agent, litagent
from litstream.workers.runner import Runner, beat_interval
from litstream.workers.sdk import AttemptContext
from litstream.workers.store import LitStore


class Background:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.thread = threading.Thread(target=runner.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.runner.stop_event.set()
        self.thread.join(timeout=60)


async def finish(store: LitStore, ids: list[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = await store.wait_for_rollouts(rollout_ids=ids, timeout=0)
        if len(done) == len(ids):
            return {r.rollout_id: r for r in done}
        await asyncio.sleep(0.2)
    raise AssertionError("rollouts did not finish")


@pytest.mark.usefixtures("processor_running")
def test_function_agents_get_resources_and_follow_new_versions(settings: Settings) -> None:
    seen: list[tuple[str, str]] = []

    @litagent
    async def agent(task: Any, llm: LLM, ctx: AttemptContext) -> float:
        seen.append((task["n"], llm.endpoint))
        with ctx.span("chat", {"gen_ai.request.model": llm.model}):
            await asyncio.sleep(0.01)
        return 1.0

    async def scenario() -> None:
        store = LitStore(settings)
        bg = Background(Runner(settings, agent, concurrency=2))
        try:
            v1 = await store.add_resources({"llm": ProxyLLM(endpoint="http://proxy:1/v1", model="policy-1")})
            first = await store.enqueue_rollout({"n": "a"})
            await finish(store, [first.rollout_id])
            v2 = await store.add_resources({"llm": LLM(endpoint="http://vllm:2/v1", model="policy-2")})
            second = await store.enqueue_rollout({"n": "b"})
            await finish(store, [second.rollout_id])
        finally:
            bg.stop()
            await store.close()
        # a proxied LLM is resolved to the attempt's own URL; the next rollout gets the newly published version
        assert seen[0][0] == "a" and seen[0][1].startswith(f"http://proxy:1/rollout/{first.rollout_id}/attempt/")
        assert seen[1] == ("b", "http://vllm:2/v1")
        codec = Codec()
        spans = [codec.decode_as(m.value(), SpanRecorded) for m in read_to_end(settings, f"{settings.topic_prefix}.spans")]
        used = {s.rollout_id: s.resources_id for s in spans}
        assert used == {first.rollout_id: v1.resources_id, second.rollout_id: v2.resources_id}

    asyncio.run(scenario())


class Flaky(LitAgent):
    """Fails its first attempt of every task, succeeds on the retry."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def rollout(self, task: Any, resources: NamedResources, rollout: AttemptedRollout) -> float:
        self.calls[rollout.rollout_id] = self.calls.get(rollout.rollout_id, 0) + 1
        if rollout.attempt.sequence_id == 1:
            raise RuntimeError("tool crashed")
        return 0.5


@pytest.mark.usefixtures("processor_running")
def test_a_failing_attempt_is_recorded_and_retried(settings: Settings) -> None:
    agent = Flaky()

    async def scenario() -> None:
        store = LitStore(settings)
        bg = Background(Runner(settings, agent, concurrency=2))
        try:
            ro = await store.enqueue_rollout({"q": 1}, config=RolloutConfig(max_attempts=2, retry_condition=["failed"]))
            done = await finish(store, [ro.rollout_id])
            assert done[ro.rollout_id].status == "succeeded"
            attempts = (await store.query_attempts(ro.rollout_id)).items
            assert [a.status for a in attempts] == ["failed", "succeeded"]
            snap = store.rollouts.snapshots[ro.rollout_id]
            assert "RuntimeError: tool crashed" in (snap.attempts[0].error or "")
        finally:
            bg.stop()
            await store.close()

    asyncio.run(scenario())


def test_an_attempt_beats_three_times_within_its_rollouts_timeout() -> None:
    assert beat_interval(5.0, None) == 5.0
    assert beat_interval(5.0, 60.0) == 5.0
    assert beat_interval(5.0, 3.0) == 1.0
    assert beat_interval(5.0, 0.01) == 0.25  # a floor: no flood of beats


@pytest.mark.usefixtures("processor_running")
def test_a_quiet_attempt_outlives_a_timeout_shorter_than_the_runners_beat(settings: Settings) -> None:
    """An agent that writes no span for 3 s, under a 1.5 s ``unresponsive_seconds``: the runner beats often
    enough that the attempt is never taken for a dead one (else it would be retried, then fail)."""

    def quiet(task: Any) -> float:
        time.sleep(3.0)
        return 1.0

    async def scenario() -> None:
        store = LitStore(settings)
        bg = Background(Runner(settings, quiet, concurrency=2))  # a free slot would claim a retry at once
        try:
            config = RolloutConfig(max_attempts=2, retry_condition=["unresponsive"], unresponsive_seconds=1.5)
            ro = await store.enqueue_rollout({"q": 1}, config=config)
            done = await finish(store, [ro.rollout_id])
            attempts = (await store.query_attempts(ro.rollout_id)).items
            assert done[ro.rollout_id].status == "succeeded"
            assert [a.status for a in attempts] == ["succeeded"]
        finally:
            bg.stop()
            await store.close()

    asyncio.run(scenario())


@pytest.mark.usefixtures("processor_running")
def test_stopping_releases_attempts_that_do_not_finish(settings: Settings) -> None:
    started = threading.Event()

    def slow(task: Any) -> None:
        started.set()
        time.sleep(5)

    async def scenario() -> None:
        store = LitStore(settings)
        runner = Runner(settings, slow, concurrency=1, drain_s=0.5)
        bg = Background(runner)
        try:
            ro = await store.enqueue_rollout({"q": 1}, config=RolloutConfig(max_attempts=2, retry_condition=["failed"]))
            assert await asyncio.to_thread(started.wait, 60)
            bg.stop()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                latest = await store.get_latest_attempt(ro.rollout_id)
                if latest is not None and latest.status == "failed":
                    break
                await asyncio.sleep(0.1)
            snap = store.rollouts.snapshots[ro.rollout_id]
            assert snap.attempts[0].status == "failed" and "released" in (snap.attempts[0].error or "")
            assert snap.status == "requeuing"  # retried per its config, not left to time out
        finally:
            await store.close()

    asyncio.run(scenario())


def test_agents_say_what_they_cannot_be_given() -> None:
    def bad(task: Any, gpu: int) -> None: ...

    with pytest.raises(TypeError, match="gpu"):
        as_agent(bad)
    with pytest.raises(TypeError, match="not an agent"):
        as_agent(42)


@pytest.mark.usefixtures("processor_running")
def test_an_offer_that_cannot_be_read_is_dead_lettered_and_the_next_one_is_run(settings: Settings) -> None:
    ran: list[int] = []

    def agent(task: Any) -> float:
        ran.append(task["n"])
        return 1.0

    offers = f"{settings.topic_prefix}.rollout-offers"

    async def scenario() -> None:
        store = LitStore(settings)
        store.events.produce_raw(offers, b"not-a-rollout", b"not an offer")
        store.events.flush()
        bg = Background(Runner(settings, agent, concurrency=1))
        try:
            ro = await store.enqueue_rollout({"n": 1})
            await finish(store, [ro.rollout_id])
        finally:
            bg.stop()
            await store.close()

    asyncio.run(scenario())
    assert ran == [1]
    letters = [m for m in read_to_end(settings, f"{offers}.dlq") if m.value() == b"not an offer"]
    assert len(letters) == 1 and dict(letters[0].headers() or [])["litstream.dlq.error_type"] == b"decode"


@pytest.mark.usefixtures("processor_running")
def test_a_runners_replica_keeps_few_finished_rollouts(settings: Settings) -> None:
    """A runner's replica answers claims only: it keeps the newest ``keep_finished`` finished rollouts (one an
    update reopens later is recalled: tests/test_rollout_replica.py), and every rollout still in play. "Newest" is the replica's fold order;
    across partitions only the replica's own order is defined, so each rollout is folded before the next one."""

    async def scenario() -> None:
        store = LitStore(settings)
        replica = RolloutReplica(settings, store.codec, keep_finished=2)

        def folded_finished(rollout_id: str) -> bool | None:
            state = replica.states.get(rollout_id)
            return True if state is not None and state.status in FINISHED else None

        try:
            done = []
            for n in range(4):
                ro = await store.start_rollout({"n": n})
                await store.update_attempt(ro.rollout_id, ro.attempt.attempt_id, status="succeeded")
                assert replica.wait_for(lambda rid=ro.rollout_id: folded_finished(rid), 30)
                done.append(ro.rollout_id)
            waiting = await store.enqueue_rollout({"n": "open"})
            assert replica.wait_for(lambda: True if waiting.rollout_id in replica.states else None, 30)
            mine = {*done, waiting.rollout_id}
            assert set(replica.states) & mine == {*done[-2:], waiting.rollout_id}
            assert sum(state.status in FINISHED for state in replica.states.values()) == 2
            assert set(replica.snapshots) == set(replica.states)
        finally:
            replica.close()
            await store.close()

    asyncio.run(scenario())
