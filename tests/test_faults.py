"""Faults with real processes: a runner killed mid-attempt, every input topic redelivered in another order, the
broker killed mid-run and restarted on its log.

(The lifecycle processor killed mid-stream is in test_lifecycle.py; the span sink killed between insert and
commit in test_sink_pipeline.py.)
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from litstream.app.stack import Stack
from litstream.infra import health
from litstream.infra.broker import KafkaBroker
from litstream.infra.clickhouse import query
from litstream.infra.kafka import admin, create_topics, producer, read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import default_codec
from litstream.schemas.events import EventFactory, NamedResourceRecord, ResourcesPublished, TripletEmitted
from litstream.schemas.models import FINISHED
from litstream.streams.replay import verify
from litstream.streams.views import ResourcesView
from tests.lifecycle_helpers import Driver
from tests.waiting import until

TESTS_DIR = str(Path(__file__).parent)


def test_a_runner_killed_mid_attempt_is_retried_elsewhere(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]))
    with Stack(settings) as stack:
        stack.start("lifecycle", "process", "lifecycle")
        stack.wait_ready("lifecycle", "lifecycle")
        runner = stack.start("runner-a", "runner", "--agent", "fault_agents:stall_first_attempt", "--concurrency", "1")
        d = Driver(settings)
        try:
            rid = d.enqueue({"n": 1}, max_attempts=2, retry_condition=["unresponsive"], unresponsive_seconds=8.0)
            d.wait(rid, lambda s: s.status == "running", timeout=90)
            os.kill(runner.proc.pid, signal.SIGKILL)  # mid-attempt: no release, no more heartbeats
            runner.proc.wait()
            stack.start("runner-b", "runner", "--agent", "fault_agents:stall_first_attempt", "--concurrency", "1")
            snap = d.wait(rid, lambda s: s.status in FINISHED, timeout=120)
        finally:
            d.close()
    assert snap.status == "succeeded"
    assert [a.status for a in snap.attempts] == ["unresponsive", "succeeded"]


def _resources(settings: Settings) -> dict[str, Any]:
    view = ResourcesView(settings, default_codec())
    try:
        assert view.caught_up(60)
        return {"latest": view.state.latest_id,
                "by_id": {k: v.model_dump() for k, v in view.state.by_id.items()}}
    finally:
        view.close()


def _wait_health(settings: Settings, role: str, done: Callable[[dict[str, Any]], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    info: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        info = health.read(settings.data_dir, role)
        if info is not None and done(info):
            return
        time.sleep(0.3)
    raise AssertionError(f"{role} did not get there in {timeout:.0f}s: {info}")


def test_every_input_topic_redelivered_shuffled_changes_nothing(settings: Settings,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]))
    topics = Topics(settings.topic_prefix)
    dsn = settings.resolved_clickhouse_dsn
    # Every column but the insert time and, for lifecycle events, the offset the row was read at (a copy's).
    tables = {"spans": "ingested_ns", "rollout_events": "(ingested_ns, kafka_offset)", "triplets": "ingested_ns"}
    with Stack(settings) as stack:
        for role in ("lifecycle", "span-sink", "triplets"):
            stack.start(role, "process", role)
        stack.start("runner", "runner", "--agent", "fault_agents:llm_call_agent", "--concurrency", "2")
        stack.wait_ready("lifecycle", "lifecycle")
        stack.wait_ready("span-sink", "span-sink", key="inserted")
        stack.wait_ready("triplets", "triplets")
        events = EventProducer(settings, role="test")
        factory = EventFactory(role="publisher")
        for version in range(2):  # two publications of one resources id, then another id
            for rid in ("rs-a", "rs-b")[: 1 + version]:
                events.send(topics.resources, ResourcesPublished(
                    **factory.stamp(), resources_id=rid, version=version + 1, create_time=time.time(), update_time=time.time(),
                    resources={"llm": NamedResourceRecord(resource_type="llm", endpoint=f"http://x/{version}",
                                                          model="m")}))
        events.flush()
        d = Driver(settings)
        try:
            rids = [d.enqueue({"q": i % 2}) for i in range(4)]
            _wait_all(d, rids)
            codec = default_codec()

            def triplet_ids() -> list[str]:
                return [codec.decode_as(m.value(), TripletEmitted).meta.event_id for m in read_to_end(settings, topics.triplets)]

            deadline = time.monotonic() + 90
            while len(triplet_ids()) < len(rids) and time.monotonic() < deadline:
                time.sleep(0.3)
            before_triplets = triplet_ids()
            assert len(before_triplets) == len(rids)
            records = {role: list(read_to_end(settings, topics.name(role)))
                       for role in ("rollout-events", "spans", "triplets", "resources")}
            n = {role: len(msgs) for role, msgs in records.items()}
            # caught up (a redelivery after a rebalance may have counted a record twice: at least, not exactly)
            _wait_health(settings, "span-sink", lambda h: h["inserted"] >= n["spans"]
                         and h["events"] >= n["rollout-events"] and h["triplets"] >= n["triplets"])
            before_state = {r: s.model_dump() for r, s in d.view.catch_up().items()}
            before_rows = {t: query(dsn, f"SELECT * EXCEPT {x} FROM {t} FINAL ORDER BY ALL").rows for t, x in tables.items()}
            before_resources = _resources(settings)
            sink0 = health.read(settings.data_dir, "span-sink") or {}
            trip0 = health.read(settings.data_dir, "triplets") or {}
            life0 = health.read(settings.data_dir, "lifecycle") or {}

            # Redeliver: exact copies (key, value, headers, partition) of every record, shuffled across topics.
            copies = [(topics.name(role), m) for role, msgs in records.items() for m in msgs]
            random.Random(11).shuffle(copies)
            raw = producer(settings)
            for topic, m in copies:
                raw.produce(topic, key=m.key(), value=m.value(), headers=m.headers(), partition=m.partition())
            raw.flush(30)

            _wait_health(settings, "lifecycle", lambda h: h["duplicates"] >= life0["duplicates"] + n["rollout-events"])
            _wait_health(settings, "span-sink", lambda h: h["inserted"] >= sink0["inserted"] + n["spans"]
                         and h["events"] >= sink0["events"] + n["rollout-events"]
                         and h["triplets"] >= sink0["triplets"] + n["triplets"])
            _wait_health(settings, "triplets", lambda h: h["late_spans"] >= trip0["late_spans"] + n["spans"])
            after_state = {r: s.model_dump() for r, s in d.view.catch_up().items()}
        finally:
            d.close()
            events.close()
        assert life0["applied"] == (health.read(settings.data_dir, "lifecycle") or {})["applied"]  # nothing re-applied
        assert after_state == before_state
        _, differences = verify(settings, wait_s=60)
        assert differences == []
        assert {t: query(dsn, f"SELECT * EXCEPT {x} FROM {t} FINAL ORDER BY ALL").rows for t, x in tables.items()} == before_rows
        after_triplets = triplet_ids()  # the originals and their injected copies; the processor made none
        assert len(after_triplets) == 2 * len(before_triplets) and set(after_triplets) == set(before_triplets)
        assert _resources(settings) == before_resources  # what a runner's resources view folds to
        assert all(p.alive() for p in stack.roles.values())


def _served(settings: Settings) -> dict[tuple[str, int, int], tuple[bytes | None, bytes | None]]:
    """Every record the broker serves on this prefix's topics (acknowledged), by topic, partition, offset."""
    names = [t for t in admin(settings).list_topics(timeout=10).topics if t.startswith(settings.topic_prefix)]
    return {(t, int(m.partition() or 0), int(m.offset() or 0)): (m.key(), m.value())
            for t in names for m in read_to_end(settings, t, timeout=60)}


@pytest.mark.slow(enabled_by="LITSTREAM_LONG_RUNS")  # a minute or more; CI runs it (.ci/run)
def test_the_broker_killed_mid_run_and_restarted_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """SIGKILL of the broker alone while rollouts are in flight, and a restart on the same log dir: every
    client (processors, runner, this test's producer and view) reconnects by itself, every record served
    before the kill is still at its offset, and every rollout finishes once, with its spans and its
    triplet."""
    broker = KafkaBroker(tmp_path / "log", log_path=tmp_path / "broker.log").start()
    try:
        settings = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                            partitions=1, data_dir=tmp_path / "data",
                            clickhouse_dsn=f"chdb://{tmp_path / 'chdb'}")
        create_topics(settings)
        with Stack(settings) as stack:
            stack.start("lifecycle", "process", "lifecycle")
            stack.start("span-sink", "process", "span-sink")
            stack.start("triplets", "process", "triplets")
            # an agent whose LLM call carries token ids, so every rollout also makes a triplet
            stack.start("runner", "runner", "--concurrency", "4", "--agent", "bench.soak:soak_agent")
            stack.wait_ready("lifecycle", "lifecycle")
            stack.wait_ready("span-sink", "span-sink", key="inserted")
            d = Driver(settings)
            try:
                before = [d.enqueue() for _ in range(3)]
                _wait_all(d, before)
                after = [d.enqueue() for _ in range(3)]  # acknowledged (flushed); the broker dies under them
                served = _served(settings)
                broker.kill()
                broker.start()
                _wait_all(d, after, timeout=180)
                snaps = d.view.catch_up()
            finally:
                d.close()
            now = _served(settings)
            assert {k: now.get(k) for k in served} == served
            _assert_all_done_once(settings, stack, snaps, before + after)
    finally:
        broker.stop()


def _assert_all_done_once(settings: Settings, stack: Stack, snaps: dict[str, Any], rids: list[str]) -> None:
    assert all(snaps[r].status == "succeeded" and len(snaps[r].attempts) == 1 for r in rids)
    assert all(stack.roles[name].alive() for name in ("lifecycle", "span-sink", "triplets", "runner"))
    result, differences = verify(settings, wait_s=60)
    assert differences == []
    assert len(result.states) == len(rids)
    spans_on_topic = sum(1 for _ in read_to_end(settings, f"{settings.topic_prefix}.spans"))
    dsn = settings.resolved_clickhouse_dsn
    until("every span in ClickHouse", lambda: int(query(dsn, "SELECT count() FROM spans FINAL").rows[0][0])
          == spans_on_topic > 0, timeout=60)
    codec = default_codec()

    def triplets() -> set[str]:
        return {codec.decode_as(m.value(), TripletEmitted).meta.rollout_id
                for m in read_to_end(settings, f"{settings.topic_prefix}.triplets")}

    # the triplet processor came back too: a triplet for every rollout, before and after the restart
    until("a triplet for every rollout", lambda: triplets() == set(rids), timeout=60)


def _wait_all(d: Driver, rids: list[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snaps = d.view.catch_up()
        if all(r in snaps and snaps[r].status in FINISHED for r in rids):
            return
        time.sleep(0.3)
    raise AssertionError("rollouts did not finish")
