"""Faults with real processes: a runner killed mid-attempt, the broker restarted on durable storage.

(The lifecycle processor killed mid-stream is in test_lifecycle.py; the span sink killed between insert and
commit in test_sink_faults.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from litstream.infra.broker import EmbeddedBroker, free_port
from litstream.infra.clickhouse import query
from litstream.infra.kafka import create_topics, read_to_end
from litstream.infra.settings import Settings
from litstream.infra.stack import Stack
from litstream.schemas.models import FINISHED
from litstream.streams.replay import verify
from tests.lifecycle_helpers import Driver

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
        settings = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                            partitions=2, data_dir=tmp_path / "data", clickhouse_dsn=f"chdb://{tmp_path / 'chdb'}")
        create_topics(settings)
        with Stack(settings) as stack:
            stack.start("lifecycle", "process", "lifecycle")
            stack.start("span-sink", "process", "span-sink")
            stack.start("runner", "runner", "--concurrency", "4")
            stack.wait_ready("lifecycle", "lifecycle")
            stack.wait_ready("span-sink", "span-sink", key="inserted")
            d = Driver(settings)
            try:
                before = [d.enqueue() for _ in range(8)]
                _wait_all(d, before)
                broker.stop()  # a clean restart: storage survives, every client has to reconnect by itself
                time.sleep(1.0)
                broker.start()
                after = [d.enqueue() for _ in range(8)]
                _wait_all(d, after, timeout=180)
                snaps = d.view.catch_up()
            finally:
                d.close()
            assert all(snaps[r].status == "succeeded" for r in before + after)
            assert all(stack.roles[name].alive() for name in ("lifecycle", "span-sink", "runner"))
            result, differences = verify(settings, wait_s=60)
            assert differences == []
            assert len(result.states) == 16
            spans_on_topic = sum(1 for _ in read_to_end(settings, f"{settings.topic_prefix}.spans"))
            dsn = settings.resolved_clickhouse_dsn
            deadline = time.monotonic() + 60
            while True:
                in_sql = int(query(dsn, "SELECT count() FROM spans FINAL").rows[0][0])
                if in_sql == spans_on_topic or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert in_sql == spans_on_topic > 0
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
