"""The triplet processor on the real broker, with the lifecycle processor writing rollout state: rollouts are
enqueued, claimed and finished with the SDK's events; the processor runs in a thread."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from litstream.infra import health
from litstream.infra.kafka import headers_dict, read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.codec import default_codec
from litstream.schemas.events import AttemptStarted, AvroModel, TripletEmitted
from litstream.streams.triplet_buffer import Limits
from litstream.streams.triplet_processor import TripletProcessor, group_id_of, triplet_event_id
from litstream.workers.client import enqueue_rollout
from litstream.workers.sdk import AttemptContext
from tests.waiting import until

LLM_ATTRS: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "toy",
                             "prompt_token_ids": [11, 12, 13], "response_token_ids": [21, 22],
                             "response_logprobs": [-0.5, -0.25], "gen_ai.prompt.0.role": "user",
                             "gen_ai.prompt.0.content": "2+2?", "gen_ai.completion.0.role": "assistant",
                             "gen_ai.completion.0.content": "4"}


class Running:
    """A processor in a thread of the test."""

    def __init__(self, settings: Settings, settle_ms: int = 300) -> None:
        self.processor = TripletProcessor(settings, limits=Limits(settle_ms=settle_ms), poll_s=0.05)
        self.thread = threading.Thread(target=self.processor.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.processor.stop_event.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        self.processor.close()


def triplets(settings: Settings) -> list[tuple[bytes, TripletEmitted]]:
    codec = default_codec()
    return [(m.key() or b"", codec.decode_as(m.value(), TripletEmitted))
            for m in read_to_end(settings, f"{settings.topic_prefix}.triplets")]


def letters(settings: Settings) -> list[dict[str, bytes]]:
    return [headers_dict(m) for m in read_to_end(settings, f"{settings.topic_prefix}.triplets.dlq")]


def start(events: EventProducer, task: Any, metadata: dict[str, Any] | None = None,
          resources_id: str = "policy-v3") -> AttemptContext:
    """Enqueue a rollout and claim it: the context records the attempt's spans."""
    rid = enqueue_rollout(events, task, metadata=metadata, resources_id=resources_id).rollout_id
    aid = f"at-{uuid.uuid4().hex[:8]}"
    events.send(events.topics.rollout_events, AttemptStarted(meta=events.factory.meta(rid), attempt_id=aid,
                                                             sequence_id=1, start_time=time.time(), worker_id="w"))
    return AttemptContext(events, rid, aid, resources_id=resources_id)


def act(ctx: AttemptContext, reward: float | None = 1.0, llm: bool = True) -> None:
    with ctx.span("agent.rollout"):
        if llm:
            with ctx.span("chat toy", LLM_ATTRS):
                pass
        with ctx.span("verify"):
            pass
        if reward is not None:
            ctx.emit_reward(reward)


@pytest.mark.usefixtures("processor_running")
def test_finished_attempts_become_triplets_keyed_by_group(settings: Settings) -> None:
    events = EventProducer(settings, role="test")
    running = Running(settings)
    try:
        same_task = {"a": 2, "b": 2, "op": "+"}
        ctxs = [start(events, same_task), start(events, same_task),
                start(events, {"a": 1}, metadata={"group_id": "g-explicit"}, resources_id="rs-custom")]
        for ctx, reward in zip(ctxs, (1.0, 0.0, 0.5)):
            act(ctx, reward)
            ctx.finish("succeeded")
        events.flush()
        until("three triplets", lambda: len(triplets(settings)) >= 3)
        got = {t.meta.rollout_id: (key, t) for key, t in triplets(settings)}
        assert len(got) == 3 and len(triplets(settings)) == 3
        task_group = got[ctxs[0].rollout_id][1].group_id
        assert task_group.startswith("task-") and got[ctxs[1].rollout_id][1].group_id == task_group
        for ctx, reward in zip(ctxs, (1.0, 0.0, 0.5)):
            key, t = got[ctx.rollout_id]
            assert key == t.group_id.encode()
            assert t.meta.event_id == triplet_event_id(ctx.rollout_id, ctx.attempt_id, 0)
            assert (t.attempt_id, t.index, t.reward) == (ctx.attempt_id, 0, reward)
            assert (t.prompt_token_ids, t.response_token_ids, t.response_logprobs) == ([11, 12, 13], [21, 22],
                                                                                       [-0.5, -0.25])
            assert (t.prompt_text, t.response_text) == ("2+2?", "4")
            assert t.metadata["attempt_status"] == "succeeded" and t.metadata["request"] == {"model": "toy"}
        assert got[ctxs[0].rollout_id][1].policy_version == "3"
        assert got[ctxs[0].rollout_id][1].resources_id == "policy-v3"
        explicit = got[ctxs[2].rollout_id][1]
        assert (explicit.group_id, explicit.policy_version, explicit.resources_id) == ("g-explicit", None, "rs-custom")
        assert letters(settings) == []
    finally:
        running.stop()


@pytest.mark.usefixtures("processor_running")
def test_attempt_without_usable_triplet_is_a_dead_letter_and_a_metric(settings: Settings) -> None:
    events = EventProducer(settings, role="test")
    running = Running(settings)
    try:
        no_llm = start(events, {"x": 1})
        act(no_llm, reward=1.0, llm=False)
        no_llm.finish("succeeded")
        no_reward = start(events, {"x": 2})
        act(no_reward, reward=None)
        no_reward.finish("failed", error="boom")
        silent = start(events, {"x": 3})  # ends without a single span
        silent.finish("failed")
        events.produce_raw(events.topics.spans, b"ro-garbage", b"not avro")
        events.flush()
        until("four dead letters", lambda: len(letters(settings)) >= 4)
        [garbage] = [h for h in letters(settings) if h["litstream.dlq.error_type"] == b"decode"]
        assert garbage["litstream.dlq.reason"].startswith(b"not a litstream Avro message")
        by_attempt = {h["litstream.attempt_id"].decode(): h for h in letters(settings) if "litstream.attempt_id" in h}
        reasons = {aid: h["litstream.dlq.reason"].decode() for aid, h in by_attempt.items()}
        assert reasons[no_llm.attempt_id].startswith("no usable triplet: no LLM call among 3 spans")
        assert reasons[no_reward.attempt_id].startswith("no usable triplet: no reward:")
        assert reasons[silent.attempt_id] == "no usable triplet: no spans"
        assert by_attempt[no_llm.attempt_id]["litstream.rollout_id"].decode() == no_llm.rollout_id
        assert {h["litstream.dlq.processor"] for h in by_attempt.values()} == {b"triplets"}
        assert triplets(settings) == []

        def beat_counts() -> bool:
            info = health.read(settings.data_dir, "triplets")
            return info is not None and info.get("no_triplet") == 3
        until("the health beat counts them", beat_counts)
        info = health.read(settings.data_dir, "triplets")
        assert info is not None and info["no_triplet_by_reason"] == {"no_LLM_call": 1, "no_reward": 1, "no_spans": 1}
    finally:
        running.stop()


class SendsSpansTwice(EventProducer):
    def send(self, topic: str, record: AvroModel, on_delivery: Any = None) -> None:
        super().send(topic, record, on_delivery=on_delivery)
        if topic == self.topics.spans:
            super().send(topic, record)  # the copy: its delivery is nobody's business


@pytest.mark.usefixtures("processor_running")
def test_duplicate_span_delivery_gives_no_duplicate_triplet(settings: Settings) -> None:
    events = SendsSpansTwice(settings, role="test")
    running = Running(settings)
    try:
        ctx = start(events, {"dup": True})
        act(ctx)
        ctx.finish("succeeded")
        events.flush()
        until("one triplet", lambda: len(triplets(settings)) >= 1)
        until("every span read", lambda: running.processor.collector.counts["spans"] >= 8)
    finally:
        running.stop()
    assert [t.meta.event_id for _, t in triplets(settings)] == [triplet_event_id(ctx.rollout_id, ctx.attempt_id, 0)]
    assert running.processor.collector.counts["duplicates"] == 4
    assert letters(settings) == []


@pytest.mark.usefixtures("processor_running")
def test_a_restarted_processor_loses_nothing_and_repeats_nothing(settings: Settings) -> None:
    events = EventProducer(settings, role="test")
    first = Running(settings)
    try:
        open_attempt = start(events, {"step": "open"})
        act(open_attempt)  # spans buffered, the attempt still running when the processor stops
        done = start(events, {"step": "done"})
        act(done)
        done.finish("succeeded")
        events.flush()
        until("the finished attempt's triplet", lambda: len(triplets(settings)) == 1)

        def open_buffered() -> bool:
            pending = first.processor.collector.pending.get((open_attempt.rollout_id, open_attempt.attempt_id))
            return pending is not None and len(pending.spans) == 4
        until("the open attempt buffered", open_buffered)
    finally:
        first.stop()
    open_attempt.finish("succeeded")
    ending = start(events, {"step": "ending"})
    act(ending, reward=0.5)
    ending.finish("succeeded")
    events.flush()
    # Stopped after it saw `ending` end, before it could finalize it (its settle time never passes).
    second = Running(settings, settle_ms=3_600_000)
    try:
        def ended_seen() -> bool:
            pending = second.processor.collector.pending.get((ending.rollout_id, ending.attempt_id))
            return pending is not None and pending.state_offset is not None
        until("the second processor sees `ending` end", ended_seen)
    finally:
        second.stop()
    third = Running(settings)
    try:
        until("three triplets", lambda: len(triplets(settings)) >= 3)
        until("caught up", lambda: not third.processor.collector.pending)
    finally:
        third.stop()
    ids = [t.meta.event_id for _, t in triplets(settings)]
    expected = {triplet_event_id(c.rollout_id, c.attempt_id, 0) for c in (open_attempt, done, ending)}
    assert set(ids) == expected
    rewards = {t.meta.rollout_id: t.reward for _, t in triplets(settings)}
    assert rewards[ending.rollout_id] == 0.5
    assert letters(settings) == []


def test_group_id_falls_back_to_a_stable_hash_of_the_input() -> None:
    from litstream.schemas.events import RolloutSnapshot

    def snap(task: Any, **metadata: Any) -> RolloutSnapshot:
        return RolloutSnapshot(rollout_id="ro-1", version=1, input=task, start_time=0.0, status="succeeded",
                               metadata=metadata, updated_ns=0)

    assert group_id_of(snap({"a": 1, "b": 2}), "ro-1") == group_id_of(snap({"b": 2, "a": 1}), "ro-2")
    assert group_id_of(snap({"a": 1}), "ro-1") != group_id_of(snap({"a": 2}), "ro-1")
    assert group_id_of(snap({"a": 1}, group_id="g"), "ro-1") == "g"


def test_spans_appended_after_the_end_was_reached_are_waited_for(settings: Settings) -> None:
    """The end-of-partition event is raised once and stays; spans the broker got since must still be read before
    an attempt is finalized "at the end" (seen under load: all of an attempt's spans dead-lettered as late)."""
    from confluent_kafka import KafkaError

    from litstream.infra.kafka import producer

    processor = TripletProcessor(settings, poll_s=0.05)
    spans_topic = processor.topics.spans
    raw = producer(settings)

    def pump(until_eof: bool) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for msg in processor.loop.consumer.consume(100, 0.1):
                processor.loop.ends[str(msg.topic())].record(msg)
                err = msg.error()
                if (until_eof and msg.topic() == spans_topic and msg.partition() == 0 and err is not None
                        and err.code() == KafkaError._PARTITION_EOF):
                    return
        assert not until_eof, "no end-of-partition event"

    try:
        raw.produce(spans_topic, key=b"k", value=b"first", partition=0)
        raw.flush(10)
        processor.loop.consumer.subscribe([spans_topic, processor.topics.state], on_assign=processor.loop.on_assign)
        pump(until_eof=True)
        assert processor._spans_read_to_end(0)
        raw.produce(spans_topic, key=b"k", value=b"second", partition=0)
        raw.flush(10)
        # the client fetches it into its queue and learns the new end; nothing is consumed
        until("the new end learned", lambda: not processor._spans_read_to_end(0), timeout=30)
        assert 0 in processor.loop.ends[spans_topic].at_end  # the flag alone would say "at the end"
        pump(until_eof=True)
        assert processor._spans_read_to_end(0)
    finally:
        processor.loop.consumer.close()
        processor.close()
