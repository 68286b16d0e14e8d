"""The lifecycle processor on the real broker: timers on its own clock, retries, claims, replay, scale-out,
restart. Each test runs real Faust worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from litstream.app.stack import Stack, settings_env
from litstream.infra import health
from litstream.infra.kafka import headers_dict, read_to_end
from litstream.infra.settings import Settings
from litstream.schemas.codec import Codec
from litstream.schemas.events import RolloutOffered, RolloutSnapshot
from litstream.schemas.models import FINISHED
from litstream.streams.replay import verify
from tests.lifecycle_helpers import Driver
from tests.waiting import until


@pytest.fixture
def lifecycle(settings: Settings) -> Iterator[tuple[Stack, Driver]]:
    with Stack(settings) as stack:
        stack.start("lifecycle", "process", "lifecycle")
        stack.wait_ready("lifecycle", "lifecycle")
        driver = Driver(settings)
        yield stack, driver
        driver.close()


def offers(settings: Settings, rid: str) -> list[int]:
    codec = Codec()
    out = []
    for msg in read_to_end(settings, f"{settings.topic_prefix}.rollout-offers"):
        offer = codec.decode_as(msg.value(), RolloutOffered)
        if offer.rollout_id == rid:
            out.append(offer.attempt_sequence)
    return out


def test_unresponsive_attempt_is_retried_without_any_call(settings: Settings, lifecycle: tuple[Stack, Driver]) -> None:
    _, d = lifecycle
    # A third attempt is allowed so that a stall of over a second on a loaded machine, between the second claim
    # and its beat, only requeues again (the beat revives the attempt) instead of failing the rollout.
    rid = d.enqueue(unresponsive_seconds=1.0, max_attempts=3, retry_condition=["unresponsive"])
    d.claim(rid, 1, "at-first")
    # Nobody calls anything: the processor's own clock notices the silent attempt.
    snap = d.wait(rid, lambda s: s.status == "requeuing")
    first = snap.attempts[0]
    assert first.status == "unresponsive" and first.end_time is None and snap.end_time is None
    assert offers(settings, rid) == [1, 2]

    d.claim(rid, 2, "at-second")
    d.beat(rid, "at-second")
    d.finish(rid, "at-second", "succeeded")
    snap = d.wait(rid, lambda s: s.status == "succeeded")
    assert [a.status for a in snap.attempts] == ["unresponsive", "succeeded"]


def test_timeout_fails_a_rollout_with_no_retries_left(lifecycle: tuple[Stack, Driver]) -> None:
    _, d = lifecycle
    rid = d.enqueue(timeout_seconds=1.5, unresponsive_seconds=30.0)
    d.claim(rid, 1, "at-slow")
    snap = d.wait(rid, lambda s: s.status in FINISHED, while_waiting=lambda: d.beat(rid, "at-slow"))
    assert snap.status == "failed" and snap.end_time is not None
    assert snap.attempts[0].status == "timeout"  # a heartbeating attempt still times out: from its start


def test_a_losing_claim_is_told_and_dead_lettered(settings: Settings, lifecycle: tuple[Stack, Driver]) -> None:
    _, d = lifecycle
    rid = d.enqueue()
    d.claim(rid, 1, "at-winner")
    d.wait(rid, lambda s: s.status == "preparing")
    losing_event = d.claim(rid, 1, "at-loser")
    snap = d.wait(rid, lambda s: s.last_event_id == losing_event)
    assert not snap.last_accepted and "claim rejected" in (snap.last_reason or "")
    assert [a.attempt_id for a in snap.attempts] == ["at-winner"]
    # The dead letter leaves on another producer than the snapshot: it may land a moment later.
    until("the rejected claim's dead letter",
          lambda: any(headers_dict(m)["litstream.dlq.error_type"] == b"rejected"
                      for m in read_to_end(settings, f"{settings.topic_prefix}.rollout-events.dlq")), timeout=60)


def test_a_run_of_reservations_leaves_the_newest_state_on_rollout_state_not_a_snapshot_each(
        settings: Settings, lifecycle: tuple[Stack, Driver]) -> None:
    """An agent reserves a span sequence id per span. The caller's answer comes from its own replica of the fold, so
    the processor holds a reservation's snapshot until its next commit, replaced by any later one of the rollout:
    the rollout-state topic still ends with the rollout's whole state, in far fewer records."""
    _, d = lifecycle
    held, finished = d.enqueue(), d.enqueue()
    for rid in (held, finished):
        d.claim(rid, 1, f"at-{rid}")
        d.reserve(rid, f"at-{rid}", 10)
    d.finish(finished, f"at-{finished}", "succeeded")
    assert d.wait(held, lambda s: s.next_sequence_id == 11).status == "preparing"  # by the commit, with nothing after
    assert d.wait(finished, lambda s: s.status == "succeeded").next_sequence_id == 11
    codec = Codec()
    snaps = [codec.decode_as(m.value(), RolloutSnapshot)
             for m in read_to_end(settings, f"{settings.topic_prefix}.rollout-state")]
    for rid in (held, finished):
        reservations = [s for s in snaps if s.rollout_id == rid and s.last_reserved is not None]
        assert 1 <= len(reservations) < 10 if rid == held else len(reservations) < 10
    result, differences = verify(settings, wait_s=30)
    assert differences == [] and result.by_status() == {"preparing": 1, "succeeded": 1}


def test_replay_equals_live_state(settings: Settings, lifecycle: tuple[Stack, Driver]) -> None:
    _, d = lifecycle
    rids = [d.enqueue(max_attempts=2, retry_condition=["failed"]) for _ in range(3)]
    for i, rid in enumerate(rids):
        d.claim(rid, 1, f"at-{i}")
        d.finish(rid, f"at-{i}", "failed" if i == 0 else "succeeded")
    for rid in rids:
        d.wait(rid, lambda s: s.status in FINISHED | {"requeuing"})
    result, differences = verify(settings, wait_s=30)
    assert differences == []
    assert result.by_status() == {"requeuing": 1, "succeeded": 2}

    out = subprocess.run([sys.executable, "-m", "litstream.app.cli", "replay", "--verify", "--json"],
                         env={**os.environ, **settings_env(settings)}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["verified"] is True


def _run_rollouts(settings: Settings, stack: Stack, n: int, on_progress=None) -> None:  # type: ignore[no-untyped-def]
    d = Driver(settings)
    try:
        rids = [d.enqueue() for _ in range(n)]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            snaps = d.view.catch_up()
            done = sum(1 for r in rids if r in snaps and snaps[r].status == "succeeded")
            failed = [snaps[r] for r in rids if r in snaps and snaps[r].status in {"failed", "cancelled"}]
            assert not failed, failed[0]
            if on_progress:
                on_progress(done)
            if done == n:
                return
            time.sleep(0.3)
        raise AssertionError(f"{done}/{n} rollouts succeeded")
    finally:
        d.close()


def test_two_workers_split_the_partitions_and_agree(broker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from litstream.infra.kafka import create_topics

    settings = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{os.getpid()}two", partitions=4,
                        data_dir=tmp_path / "data", clickhouse_dsn=f"chdb://{tmp_path / 'chdb'}")
    create_topics(settings)
    # Two workers of one app: separate data dirs (their health files), the same topics and group.
    with Stack(settings) as a, Stack(settings.model_copy(update={"data_dir": tmp_path / "data-b"})) as b:
        a.start("lifecycle", "process", "lifecycle")
        b.start("lifecycle", "process", "lifecycle")
        a.start("runner", "runner", "--concurrency", "4")
        a.wait_ready("lifecycle", "lifecycle")
        b.wait_ready("lifecycle", "lifecycle")
        _run_rollouts(settings, a, 24)
        _, differences = verify(settings, wait_s=30)
        assert differences == []
        time.sleep(2.5)  # one more health beat with the final counts
        applied = [health.read(s.settings.data_dir, "lifecycle")["applied"] for s in (a, b)]  # type: ignore[index]
        assert all(n > 0 for n in applied), applied  # both did part of the work


@pytest.mark.parametrize("store", ["rocksdb", "memory"])
def test_a_killed_worker_recovers_its_table_exactly(settings: Settings, store: str) -> None:
    settings = settings.model_copy(update={"table_store": store})
    with Stack(settings) as stack:
        stack.start("lifecycle", "process", "lifecycle")
        stack.start("runner", "runner", "--concurrency", "4")
        stack.wait_ready("lifecycle", "lifecycle")
        killed = []

        def kill_midway(done: int) -> None:
            if done >= 5 and not killed:
                os.kill(stack.roles["lifecycle"].proc.pid, signal.SIGKILL)
                stack.roles["lifecycle"].proc.wait()
                killed.append(done)
                stack.start("lifecycle", "process", "lifecycle")  # restarted: recovers from the changelog

        _run_rollouts(settings, stack, 20, on_progress=kill_midway)
        assert killed
        _, differences = verify(settings, wait_s=30)
        assert differences == []


def test_a_change_in_the_local_store_but_not_on_kafka_reaches_the_changelog(
        settings: Settings, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Killed after the RocksDB write and before the changelog write: the restarted worker finds the change in its
    local copy, so the redelivered event is a duplicate; it must still reach the changelog, where the partition's
    next owner (here a worker with an empty data dir) reads it."""
    from litstream.infra import failpoints

    assert settings.table_store == "rocksdb"
    monkeypatch.setenv(failpoints.ENV, "lifecycle.after-table-write@2")
    d = Driver(settings)
    try:
        with Stack(settings) as stack:
            doomed = stack.start("lifecycle", "process", "lifecycle")
            stack.wait_ready("lifecycle", "lifecycle")
            rid = d.enqueue()
            d.claim(rid, 1, "at-local")  # the second table write: the process dies right after it
            assert doomed.proc.wait(60) == failpoints.EXIT_CODE
            monkeypatch.delenv(failpoints.ENV)
            stack.start("lifecycle", "process", "lifecycle")  # same data dir: the claim is in its local copy
            d.wait(rid, lambda s: s.status == "preparing")
        elsewhere = settings.model_copy(update={"data_dir": tmp_path / "data-elsewhere"})
        with Stack(elsewhere) as stack:  # a new owner: only the changelog to go by
            stack.start("lifecycle", "process", "lifecycle")
            stack.wait_ready("lifecycle", "lifecycle")
            d.beat(rid, "at-local")
            assert d.wait(rid, lambda s: s.status == "running").attempts[0].attempt_id == "at-local"
    finally:
        d.close()


def test_a_local_table_copy_written_against_a_reset_log_is_thrown_away(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A fresh broker, the same data dir: the RocksDB copy of the old log must not leak into the new one."""
    from litstream.infra.broker import KafkaBroker
    from litstream.infra.kafka import create_topics

    def stack_settings(broker: KafkaBroker) -> Settings:
        s = Settings(bootstrap_servers=broker.bootstrap, topic_prefix="reset", partitions=2,
                     data_dir=tmp_path / "data", clickhouse_dsn=f"chdb://{tmp_path / 'chdb'}")
        create_topics(s)
        return s

    with KafkaBroker(log_path=tmp_path / "broker-1.log") as first:
        settings = stack_settings(first)
        with Stack(settings) as stack:
            stack.start("lifecycle", "process", "lifecycle")
            stack.wait_ready("lifecycle", "lifecycle")
            d = Driver(settings)
            rids = [d.enqueue() for _ in range(4)]
            for i, rid in enumerate(rids):
                d.claim(rid, 1, f"at-{i}")
            for rid in rids:
                d.wait(rid, lambda s: s.status == "preparing")
            d.close()
    with KafkaBroker(log_path=tmp_path / "broker-2.log") as second:
        settings = stack_settings(second)
        with Stack(settings) as stack:
            proc = stack.start("lifecycle", "process", "lifecycle")
            stack.wait_ready("lifecycle", "lifecycle")
            d = Driver(settings)
            try:
                for i, rid in enumerate(rids):  # unknown on this log: rejected, not applied to a stale row
                    d.beat(rid, f"at-{i}")
                deadline = time.monotonic() + 60
                while (health.read(settings.data_dir, "lifecycle") or {}).get("dead_letters", 0) < len(rids):
                    assert time.monotonic() < deadline, health.read(settings.data_dir, "lifecycle")
                    time.sleep(0.3)
                assert (health.read(settings.data_dir, "lifecycle") or {})["applied"] == 0
                assert all(r not in d.view.catch_up() for r in rids)
            finally:
                d.close()
            assert proc.log_path is not None and "ahead of" in proc.log_path.read_text()
