"""Faults with real processes: a runner killed mid-attempt, every input topic redelivered in another order, the
broker restarted on durable storage.

(The lifecycle processor killed mid-stream is in test_lifecycle.py; the span sink killed between insert and
commit in test_sink_pipeline.py.)
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from litstream.app.stack import Stack
from litstream.infra import health
from litstream.infra.broker import EmbeddedBroker, free_port
from litstream.infra.clickhouse import query
from litstream.infra.kafka import create_topics, producer, read_to_end
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
            _wait_health(settings, "span-sink", lambda h: (h["inserted"], h["events"], h["triplets"]) ==
                         (n["spans"], n["rollout-events"], n["triplets"]))
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


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    """A loopback S3 server (moto) with a bucket for the broker's storage."""
    boto3 = pytest.importorskip("boto3")
    port = free_port()
    with open(tmp_path / "moto.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="eu-west-2")
        deadline = time.monotonic() + 30
        while True:
            try:
                s3.create_bucket(Bucket="tansu", CreateBucketConfiguration={"LocationConstraint": "eu-west-2"})
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_broker_restart_on_durable_storage_loses_nothing(s3_endpoint: str, tmp_path: Path) -> None:
    env = {"AWS_ENDPOINT": s3_endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "eu-west-2", "AWS_ALLOW_HTTP": "true"}
    broker = EmbeddedBroker(storage="s3://tansu/", env=env, log_path=tmp_path / "broker.log").start()
    try:
        # One partition a topic and few rollouts: every fetch lists objects on the S3 server, which is slow.
        # A 200 ms fetch wait: every fetch lists objects on the (single-threaded) S3 server, and ~8 consumers
        # fetching every 10 ms saturate it.
        settings = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                            partitions=1, data_dir=tmp_path / "data", clickhouse_dsn=f"chdb://{tmp_path / 'chdb'}",
                            local_fetch_wait_ms=200)
        create_topics(settings)
        with Stack(settings) as stack:
            stack.start("lifecycle", "process", "lifecycle")
            stack.start("span-sink", "process", "span-sink")
            stack.start("triplets", "process", "triplets")
            # an agent whose LLM call carries token ids, so every rollout also makes a triplet
            stack.start("runner", "runner", "--concurrency", "4", "--agent", "litstream.bench.soak:soak_agent")
            stack.wait_ready("lifecycle", "lifecycle")
            stack.wait_ready("span-sink", "span-sink", key="inserted")
            d = Driver(settings)
            try:
                before = [d.enqueue() for _ in range(3)]
                _wait_all(d, before)
                broker.stop()  # a clean restart: storage survives, every client has to reconnect by itself
                time.sleep(1.0)
                broker.start()
                after = [d.enqueue() for _ in range(3)]
                _wait_all(d, after, timeout=180)
                snaps = d.view.catch_up()
            finally:
                d.close()
            assert all(snaps[r].status == "succeeded" for r in before + after)
            assert all(stack.roles[name].alive() for name in ("lifecycle", "span-sink", "triplets", "runner"))
            result, differences = verify(settings, wait_s=60)
            assert differences == []
            assert len(result.states) == 6
            spans_on_topic = sum(1 for _ in read_to_end(settings, f"{settings.topic_prefix}.spans"))
            dsn = settings.resolved_clickhouse_dsn
            deadline = time.monotonic() + 60
            while True:
                in_sql = int(query(dsn, "SELECT count() FROM spans FINAL").rows[0][0])
                if in_sql == spans_on_topic or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert in_sql == spans_on_topic > 0
            codec = default_codec()

            def triplets() -> set[str]:
                return {codec.decode_as(m.value(), TripletEmitted).meta.rollout_id
                        for m in read_to_end(settings, f"{settings.topic_prefix}.triplets")}

            # the triplet processor came back too: one triplet per rollout, before and after the restart
            until("a triplet for every rollout", lambda: triplets() == set(before + after), timeout=60)
    finally:
        broker.stop()


def _wait_all(d: Driver, rids: list[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snaps = d.view.catch_up()
        if all(r in snaps and snaps[r].status in FINISHED for r in rids):
            return
        time.sleep(0.3)
    raise AssertionError("rollouts did not finish")
