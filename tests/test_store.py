"""The Store API (the reference's LightningStore methods) on the real pipeline: lifecycle processor and span
sink as processes, the store in this process."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from litstream.app.stack import Stack
from litstream.infra.settings import Settings
from litstream.schemas.models import LLM, EnqueueRolloutRequest, PromptTemplate, RolloutConfig, Span
from litstream.streams import offers as offers_module
from litstream.workers.store import LitStore


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def make_span(rid: str, aid: str, seq: int, name: str = "chat", **attrs: Any) -> Span:
    now = time.time()
    return Span(rollout_id=rid, attempt_id=aid, sequence_id=seq, trace_id="1" * 32, span_id=f"{seq:016x}",
                parent_id=None, name=name, attributes=attrs, start_time=now, end_time=now + 0.01)


def test_store_api(pipeline: Settings) -> None:
    async def scenario() -> None:
        store = LitStore(pipeline)
        await store.wait_until_ready()
        try:
            # resources: add, update (version+1), latest; new rollouts are stamped with the latest
            r1 = await store.add_resources({"main_llm": LLM(endpoint="http://127.0.0.1:1/v1", model="m")})
            assert r1.version == 1 and r1.resources_id.startswith("rs-")
            r1b = await store.update_resources(r1.resources_id, {"prompt": PromptTemplate(template="Q: {q}")})
            assert r1b.version == 2 and (await store.get_latest_resources()).resources_id == r1.resources_id  # type: ignore[union-attr]

            ro = await store.enqueue_rollout({"q": 1}, mode="train", config=RolloutConfig(max_attempts=2,
                                                                                          retry_condition=["failed"]))
            assert ro.status == "queuing" and ro.resources_id == r1.resources_id
            assert (await store.get_rollout_by_id(ro.rollout_id)) is not None  # read-your-writes

            claimed = await store.dequeue_rollout(worker_id="w-1")
            assert claimed is not None and claimed.rollout_id == ro.rollout_id
            assert claimed.status == "preparing" and claimed.attempt.sequence_id == 1
            assert await store.dequeue_rollout(worker_id="w-2") is None  # nothing else on offer

            # spans: sequence ids from the store, heartbeats promote the attempt, read back from ClickHouse
            aid = claimed.attempt.attempt_id
            seqs = [await store.get_next_span_sequence_id(ro.rollout_id, aid) for _ in range(3)]
            assert seqs == sorted(seqs) and len(set(seqs)) == 3
            added = await store.add_many_spans([make_span(ro.rollout_id, aid, s, reward=0.5) for s in seqs])
            assert len(added) == 3
            assert await store.add_span(make_span(ro.rollout_id, aid, seqs[0])) is None  # duplicate
            with pytest.raises(ValueError, match="not found"):
                await store.add_span(make_span("ro-nope", aid, 1))
            spans = await store.query_spans(ro.rollout_id, "latest")
            assert [s.sequence_id for s in spans.items] == seqs
            assert spans.items[0].attributes["reward"] == 0.5  # typed attributes survive
            one = await store.query_spans(ro.rollout_id, span_id=f"{seqs[1]:016x}", name_contains="zzz",
                                          filter_logic="or")
            assert [s.sequence_id for s in one.items] == [seqs[1]]
            assert (await store.query_spans(ro.rollout_id, name="nope")).total == 0
            assert (await store.get_next_span_sequence_id(ro.rollout_id, aid)) > seqs[-1]

            latest = await store.get_latest_attempt(ro.rollout_id)
            assert latest is not None and latest.status == "running" and latest.last_heartbeat_time

            # a failure retries (requeuing); a forced attempt; then success finishes it
            await store.update_attempt(ro.rollout_id, "latest", status="failed")
            assert (await store.get_rollout_by_id(ro.rollout_id)).status == "requeuing"  # type: ignore[union-attr]
            second = await store.start_attempt(ro.rollout_id, worker_id="w-1")
            assert second.attempt.sequence_id == 2
            att = await store.update_attempt(ro.rollout_id, second.attempt.attempt_id, status="succeeded",
                                             metadata={"score": 1})
            assert att.end_time is not None and att.metadata == {"score": 1}
            done = await store.wait_for_rollouts(rollout_ids=[ro.rollout_id, "ro-unknown"], timeout=10)
            assert [r.status for r in done] == ["succeeded"]
            same = await store.update_rollout(ro.rollout_id, status="succeeded")  # its own status again: a no-op
            assert same.status == "succeeded" and same.end_time == done[0].end_time
            with pytest.raises(ValueError, match="terminal"):
                await store.cancel_rollout(ro.rollout_id)  # a status event: terminal states stay final
            meta = await store.update_rollout(ro.rollout_id, metadata={"note": "kept"})
            assert meta.metadata == {"note": "kept"} and meta.status == "succeeded"

            attempts = await store.query_attempts(ro.rollout_id)
            assert [a.status for a in attempts.items] == ["failed", "succeeded"]

            # start_rollout bypasses the queue
            started = await store.start_rollout({"q": 2}, worker_id="w-3")
            assert started.status == "preparing" and started.attempt.worker_id == "w-3"

            many = await store.enqueue_many_rollouts([])
            assert many == []
            page = await store.query_rollouts(status_in=["succeeded", "preparing"], sort_by="start_time",
                                              limit=1, offset=1)
            assert page.total == 2 and len(page.items) == 1 and page.items[0].rollout_id == started.rollout_id
            with pytest.raises(ValueError):
                await store.query_rollouts(limit=0)

            # workers: derived from attempts, plus their own heartbeats
            w = await store.update_worker("w-1", heartbeat_stats={"gpu": 0.5})
            assert w.heartbeat_stats == {"gpu": 0.5}
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                w3 = await store.get_worker_by_id("w-3")
                if w3 is not None and w3.status == "busy":
                    break
                await asyncio.sleep(0.1)
            assert w3 is not None and w3.status == "busy" and w3.current_rollout_id == started.rollout_id
            idle = await store.query_workers(status_in=["idle"])
            # w-1's attempt succeeded; w-2 found nothing to dequeue: both idle, as in the reference
            assert sorted(x.worker_id for x in idle.items) == ["w-1", "w-2"]
        finally:
            await store.close()

    run(scenario())


def test_a_bounded_store_reads_the_rollouts_it_let_go_of_from_clickhouse(pipeline: Settings) -> None:
    """A store holding 2 finished rollouts answers every read as a store holding all of them: the older finished
    ones come from ClickHouse's ``rollouts`` table, a page reads only what it shows, and an update reopens one."""

    async def scenario() -> None:
        full = LitStore(pipeline)
        bounded = LitStore(pipeline.model_copy(update={"store_keep_finished": 2}))
        try:
            ids = []
            for n in range(6):
                ro = await full.start_rollout({"n": n}, metadata={"n": n})
                await full.update_attempt(ro.rollout_id, ro.attempt.attempt_id,
                                          status="succeeded" if n % 2 else "failed")
                ids.append(ro.rollout_id)
            ids.append((await full.enqueue_rollout({"n": 6})).rollout_id)  # unfinished: always held
            await bounded.wait_until_ready()
            assert bounded.rollouts.let_go == 4 and ids[0] not in bounded.rollouts.snapshots
            assert bounded.rollouts.let_go_statuses == {"failed": 2, "succeeded": 2}

            def same(a: Any, b: Any) -> None:
                assert [r.rollout_id for r in a.items] == [r.rollout_id for r in b.items] and a.total == b.total
                assert [r.model_dump() for r in a.items] == [r.model_dump() for r in b.items]

            for query in ({"sort_by": "start_time"}, {"sort_by": "start_time", "sort_order": "desc", "limit": 3},
                          {"sort_by": "rollout_id", "limit": 2, "offset": 3}, {"sort_by": "end_time"},
                          {"sort_by": "end_time", "sort_order": "desc", "limit": 4, "offset": 1},
                          {"status_in": ["succeeded"], "sort_by": "start_time"},
                          {"status_in": ["failed"], "rollout_id_contains": ids[4][-4:], "filter_logic": "or",
                           "sort_by": "status", "limit": 10},
                          {"sort_by": "metadata", "limit": 2}):  # not a column: read whole, sorted here
                if query.get("sort_by") == "metadata":
                    with pytest.raises(ValueError, match="not comparable"):
                        await bounded.query_rollouts(**query)
                    continue
                same(await bounded.query_rollouts(**query), await full.query_rollouts(**query))
            unsorted = await bounded.query_rollouts()
            assert sorted(r.rollout_id for r in unsorted.items) == sorted(ids) and unsorted.total == 7

            old = await bounded.get_rollout_by_id(ids[0])
            assert old is not None and old.model_dump() == (await full.get_rollout_by_id(ids[0])).model_dump()  # type: ignore[union-attr]
            assert (await bounded.query_attempts(ids[1])).total == 1
            assert [r.rollout_id for r in await bounded.wait_for_rollouts(rollout_ids=ids[:2], timeout=5)] == ids[:2]
            stats, full_stats = await bounded.statistics(), await full.statistics()
            assert (stats["total_rollouts"], stats["total_attempts"]) == (full_stats["total_rollouts"],
                                                                          full_stats["total_attempts"]) == (7, 6)
            assert await bounded.get_rollout_by_id("ro-nope") is None

            reopened = await bounded.update_rollout(ids[0], status="requeuing")  # the replica recalls it
            assert reopened.status == "requeuing" and ids[0] in bounded.rollouts.snapshots
            assert bounded.rollouts.let_go == 3 and bounded.rollouts.let_go_statuses == {"failed": 1, "succeeded": 2}
        finally:
            await bounded.close()
            await full.close()

    run(scenario())


def test_recent_spans_come_from_the_window_as_clickhouse_holds_them(pipeline: Settings) -> None:
    """A rollout begun while the store runs: its spans come from the store's window, the same spans, filtered the
    same way, as ClickHouse's table gives; a store opened after the rollout began asks ClickHouse."""
    from litstream.infra import clickhouse
    from litstream.schemas.events import SpanRecorded
    from litstream.streams.span_query import SpanQuery, newest_copies
    from litstream.workers.store import span_from_record

    async def scenario() -> None:
        store = LitStore(pipeline)
        await store.wait_until_ready()
        later: LitStore | None = None
        try:
            ro = await store.start_rollout({"q": 1})
            rid, aid = ro.rollout_id, ro.attempt.attempt_id
            seqs = await store.get_many_span_sequence_ids([(rid, aid)] * 4)
            spans = [make_span(rid, aid, s, name=n) for s, n in zip(seqs, ("chat", "tool", "chat-2", "reward"))]
            spans[1] = spans[1].model_copy(update={"parent_id": spans[0].span_id})
            await store.add_many_spans(spans)
            store.spans.wait_for_sink(rid)

            def table(q: SpanQuery) -> list[dict[str, Any]]:
                sql, parameters = q.sql()
                rows = clickhouse.query(pipeline.resolved_clickhouse_dsn, sql, may_open=False, wait_s=10,
                                        parameters=parameters).rows
                return [span_from_record(SpanRecorded.model_validate_json(r)).model_dump() for r in newest_copies(rows)]

            for q in (SpanQuery.of(rid, None, "and"), SpanQuery.of(rid, aid, "and", SpanName=(None, "chat")),
                      SpanQuery.of(rid, aid, "or", SpanName=("reward", None), ParentSpanId=(spans[0].span_id, None)),
                      SpanQuery.of(rid, "at-other", "and")):
                recent = store.span_window.spans(q, store.spans.sink.wanted(rid))
                assert recent is not None
                assert [span_from_record(s).model_dump() for s in recent] == table(q)
            assert [s.name for s in (await store.query_spans(rid, name_contains="chat")).items] == ["chat", "chat-2"]

            later = LitStore(pipeline)
            await later.wait_until_ready()
            assert later.span_window.spans(SpanQuery.of(rid, None, "and"), {}) is None  # begun before it opened
            assert [s.span_id for s in (await later.query_spans(rid)).items] == [s.span_id for s in spans]
        finally:
            if later is not None:
                await later.close()
            await store.close()

    run(scenario())


def test_sequence_ids_from_many_writers_are_unique_and_increasing(pipeline: Settings) -> None:
    async def scenario() -> None:
        a, b = LitStore(pipeline), LitStore(pipeline)
        try:
            ro = await a.start_rollout({"q": 3})
            aid = ro.attempt.attempt_id
            await b.wait_until_ready()

            async def ask(store: LitStore, n: int) -> list[int]:
                return [await store.get_next_span_sequence_id(ro.rollout_id, aid) for _ in range(n)]

            got_a, got_b, batch = await asyncio.gather(
                ask(a, 8), ask(b, 8), b.get_many_span_sequence_ids([(ro.rollout_id, aid)] * 5))
            everything = got_a + got_b + batch
            assert len(set(everything)) == len(everything) == 21
            for ids in (got_a, got_b, batch):
                assert ids == sorted(ids)  # each writer sees them strictly increasing
            assert min(everything) == 1 and max(everything) == 21
        finally:
            await a.close()
            await b.close()

    run(scenario())


def test_an_enqueue_is_durable_before_the_processor_folds_it(settings: Settings) -> None:
    """The log, not the processor, takes the work: with no lifecycle processor running an enqueue still returns
    (once the broker holds the event), its rollout reads back at once from this store, and a processor started
    later offers it, so a dequeue claims it."""

    async def scenario() -> None:
        store = LitStore(settings, wait_s=60.0)
        try:
            await store.wait_until_ready()
            first = await store.enqueue_rollout({"q": 1}, mode="train")
            more = await store.enqueue_many_rollouts([EnqueueRolloutRequest(input={"q": i}) for i in (2, 3)])
            got = await store.get_rollout_by_id(first.rollout_id)
            assert got is not None and got.status == "queuing" and got.input == {"q": 1}
            assert {r.rollout_id for r in (await store.query_rollouts(status_in=["queuing"])).items} == \
                {first.rollout_id, *(r.rollout_id for r in more)}
            with Stack(settings) as stack:
                stack.start("lifecycle", "process", "lifecycle")
                claimed = await store.dequeue_many_rollouts(limit=3, worker_id="w-1")  # waits for the fold
                assert sorted(r.rollout_id for r in claimed) == sorted([first.rollout_id, *(r.rollout_id for r in more)])
                assert all(r.attempt.status == "preparing" for r in claimed)
        finally:
            await store.close()

    run(scenario())


def test_a_store_that_stops_dequeuing_leaves_its_offers_to_the_others(pipeline: Settings,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway that served one dequeue joined the runners' group and holds offer partitions; once it serves no
    more it must leave them, or the offers there would wait for it (a member that stops polling keeps them until
    the broker evicts it, minutes later) while another runner asks for work."""
    monkeypatch.setattr(offers_module, "OFFER_IDLE_S", 2.0)

    async def scenario() -> None:
        gateway, runner = LitStore(pipeline), LitStore(pipeline)
        try:
            await gateway.wait_until_ready()
            await runner.wait_until_ready()
            first = await gateway.enqueue_rollout({"q": 0})
            claimed = await gateway.dequeue_rollout(worker_id="gateway")  # joins the group: every partition
            assert claimed is not None and claimed.rollout_id == first.rollout_id
            rest = await gateway.enqueue_many_rollouts([EnqueueRolloutRequest(input={"q": i}) for i in range(1, 9)])
            got: list[str] = []
            deadline = time.monotonic() + 90
            while len(got) < len(rest) and time.monotonic() < deadline:
                got += [r.rollout_id for r in await runner.dequeue_many_rollouts(limit=len(rest))]
            assert sorted(got) == sorted(r.rollout_id for r in rest)
        finally:
            await gateway.close()
            await runner.close()

    run(scenario())


def test_ids_spans_chose_themselves_are_never_handed_out_again(pipeline: Settings) -> None:
    """Spans may carry sequence ids their writer chose; the heartbeat that moves the rollout's counter past them is
    held back (one per attempt a second), yet it reaches the log before this store's next reservation, and within
    about a second when none follows."""
    async def scenario() -> None:
        store = LitStore(pipeline)
        try:
            await store.wait_until_ready()
            ro = await store.start_rollout({"q": 1})
            aid = ro.attempt.attempt_id
            await store.add_span(make_span(ro.rollout_id, aid, 40))  # starts the attempt: its beat is waited for
            await store.add_many_spans([make_span(ro.rollout_id, aid, s) for s in (41, 42)])  # beat held back
            assert await store.get_next_span_sequence_id(ro.rollout_id, aid) == 43
            await store.add_span(make_span(ro.rollout_id, aid, 60))
            deadline = time.monotonic() + 10
            while store.rollouts.known(ro.rollout_id).next_sequence_id <= 60 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert store.rollouts.known(ro.rollout_id).next_sequence_id == 61
        finally:
            await store.close()

    run(scenario())


def test_an_agent_reserving_an_id_per_span_adds_no_heartbeat_per_span(pipeline: Settings) -> None:
    """The stock client's loop: an id reserved, then its span, ten times. The spans used reserved ids, which the
    rollout's counter is past already, so no beat has to go before each reservation: beats keep their throttle
    (one a second), and the log holds about one per attempt, not one per span."""
    from litstream.infra.kafka import read_to_end
    from litstream.schemas.codec import Codec
    from litstream.schemas.events import AttemptHeartbeat
    from litstream.streams.span_beats import SPAN_HEARTBEAT_EVERY_S

    async def scenario() -> tuple[str, float]:
        store = LitStore(pipeline)
        try:
            await store.wait_until_ready()
            ro = await store.start_rollout({"q": 1})
            aid = ro.attempt.attempt_id
            began = time.monotonic()
            for _ in range(10):
                seq = await store.get_next_span_sequence_id(ro.rollout_id, aid)
                await store.add_span(make_span(ro.rollout_id, aid, seq))
            took = time.monotonic() - began
            await store.update_attempt(ro.rollout_id, aid, status="succeeded")
            return ro.rollout_id, took
        finally:
            await store.close()

    rid, took = run(scenario())
    codec = Codec()
    events = [codec.decode(m.value()) for m in read_to_end(pipeline, f"{pipeline.topic_prefix}.rollout-events")]
    beats = [e for e in events if isinstance(e, AttemptHeartbeat) and e.rollout_id == rid]
    # the first span's beat starts the attempt; then one a second at most, and the last before the attempt ends
    assert 1 <= len(beats) <= 2 + int(took / SPAN_HEARTBEAT_EVERY_S)
    assert max(b.max_sequence_id or 0 for b in beats) == 10
