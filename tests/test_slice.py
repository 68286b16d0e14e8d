"""The walking skeleton end to end, through real processes: broker, lifecycle processor (Faust), span sink
(chDB), runner. Rollouts go from enqueued to succeeded; spans reach ClickHouse; bad messages become dead
letters and the pipeline goes on."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from litstream.app.stack import Stack, settings_env
from litstream.infra import clickhouse
from litstream.infra.kafka import headers_dict, producer, read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.models import FINISHED
from litstream.streams.stateview import StateView
from litstream.workers.client import enqueue_rollout


@pytest.fixture
def stack(settings: Settings) -> Iterator[Stack]:
    with Stack(settings) as s:
        s.start("lifecycle", "process", "lifecycle")
        s.start("span-sink", "process", "span-sink")
        s.start("runner", "runner", "--concurrency", "3")
        s.wait_ready("span-sink", "span-sink", key="inserted")
        yield s


def wait_finished(settings: Settings, ids: list[str], timeout: float = 90.0) -> dict:
    with StateView(settings) as view:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snaps = view.catch_up()
            if all(rid in snaps and snaps[rid].status in FINISHED for rid in ids):
                return snaps
            time.sleep(0.3)
    raise AssertionError(f"not finished in {timeout}s: {[(r, snaps.get(r) and snaps[r].status) for r in ids]}")


def span_count(settings: Settings, expected: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    n = -1
    while time.monotonic() < deadline:
        n = int(clickhouse.query(settings.resolved_clickhouse_dsn, "SELECT count() FROM spans FINAL").rows[0][0])
        if n >= expected:
            return n
        time.sleep(0.3)
    return n


def cli(settings: Settings, *args: str) -> str:
    env = {**settings_env(settings)}
    import os
    out = subprocess.run([sys.executable, "-m", "litstream.app.cli", *args], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_rollouts_run_end_to_end(settings: Settings, stack: Stack) -> None:
    events = EventProducer(settings, role="test")
    ids = [enqueue_rollout(events, {"a": i, "b": 2, "op": "+"}).rollout_id for i in range(4)]
    events.flush()
    snaps = wait_finished(settings, ids)
    for rid in ids:
        s = snaps[rid]
        assert s.status == "succeeded", s
        assert len(s.attempts) == 1 and s.attempts[0].status == "succeeded"
        assert s.attempts[0].worker_id and s.end_time is not None

    on_topic = sum(1 for _ in read_to_end(settings, events.topics.spans))
    assert on_topic >= 3 * len(ids)  # at least three spans per rollout, one of them the reward
    assert span_count(settings, on_topic) == on_topic
    rewards = clickhouse.query(settings.resolved_clickhouse_dsn,
                               "SELECT count(DISTINCT rollout_id) FROM spans FINAL WHERE reward = 1").rows[0][0]
    assert rewards == len(ids)  # '+' tasks are answered right by the toy policy

    listed = [json.loads(line) for line in cli(settings, "rollouts", "--json").splitlines()]
    assert {r["rollout_id"] for r in listed} == set(ids)
    table = cli(settings, "sql", "SELECT rollout_id, count() AS n FROM spans FINAL GROUP BY rollout_id",
                "--format", "csv")
    assert table.splitlines()[0] == "rollout_id,n" and len(table.splitlines()) == len(ids) + 1


def test_bad_messages_become_dead_letters_and_processing_goes_on(settings: Settings, stack: Stack) -> None:
    raw = producer(settings)
    topics = EventProducer(settings, role="test").topics
    raw.produce(topics.rollout_events, key=b"ro-garbage", value=b"not avro at all")
    raw.produce(topics.spans, key=b"ro-garbage", value=b"\xc3\x01" + b"\x01" * 8 + b"x")
    raw.flush(10)

    events = EventProducer(settings, role="test")
    rid = enqueue_rollout(events, {"a": 1, "b": 1, "op": "+"}).rollout_id
    events.flush()
    assert wait_finished(settings, [rid])[rid].status == "succeeded"

    def dead_letters(topic: str, timeout: float = 30.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = list(read_to_end(settings, topic))
            if found:
                return found
            time.sleep(0.5)
        return []

    lifecycle_dlq = dead_letters(topics.dlq("rollout-events"))
    assert len(lifecycle_dlq) == 1
    h = headers_dict(lifecycle_dlq[0])
    assert h["litstream.dlq.error_type"] == b"decode" and b"not a litstream Avro message" in h["litstream.dlq.reason"]
    assert lifecycle_dlq[0].value() == b"not avro at all"  # the original bytes, for inspection and replay

    span_dlq = dead_letters(topics.dlq("spans"))
    assert len(span_dlq) == 1 and b"unknown schema fingerprint" in headers_dict(span_dlq[0])["litstream.dlq.reason"]
