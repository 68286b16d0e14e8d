"""The durable embedded log: `litstream up` stopped mid-run (SIGTERM as Ctrl-C does, or SIGKILL of every process)
and started again in the same data dir.

Each test runs the real stack: `litstream up` (noida-db with its log under the data dir, the lifecycle processor,
the span sink, the triplet processor) and a runner, with rollouts finished and rollouts in flight when it stops.
After a SIGKILL the log is its last snapshot (noida-db writes one about a second after changes): what it holds is
what is checked, and it must be consistent: offsets unchanged, committed offsets within it, replay equal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from litstream.infra import health
from litstream.infra.clickhouse import query
from litstream.infra.kafka import admin, consumer, read_to_end
from litstream.infra.log_storage import EmbeddedLog, check_free_space, log_files_bytes, noida_binary
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.events import EventFactory, NamedResourceRecord, ResourcesPublished
from litstream.schemas.models import FINISHED
from litstream.streams.replay import verify
from tests.lifecycle_helpers import Driver
from tests.waiting import until

TESTS_DIR = str(Path(__file__).parent)


def _noida_missing() -> bool:
    try:
        noida_binary()
    except RuntimeError:
        return True
    return False


pytestmark = pytest.mark.skipif(_noida_missing(), reason="noida-db is not installed: pip install 'litstream[local]'")

# the consumer groups (after the topic prefix) whose committed offsets must survive
GROUPS = ("lifecycle", "span-sink", "triplets", "runners")


class UpProcess:
    """`litstream up` in a data dir, plus a runner (another process of the same stack)."""

    def __init__(self, data_dir: Path, prefix: str) -> None:
        self.data_dir = data_dir
        self.env = {**os.environ, "LITSTREAM_DATA_DIR": str(data_dir), "LITSTREAM_TOPIC_PREFIX": prefix,
                    "LITSTREAM_PARTITIONS": "1", "LITSTREAM_BROKER_STORAGE": "durable",
                    # noida-db refuses session timeouts under 6 s (Apache Kafka's group.min.session.timeout.ms)
                    "LITSTREAM_LOCAL_SESSION_TIMEOUT_MS": "6000",
                    "PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")])}
        self.env.pop("LITSTREAM_BOOTSTRAP_SERVERS", None)
        self.up: subprocess.Popen[bytes] | None = None
        self.others: list[subprocess.Popen[bytes]] = []  # the triplet processor and a runner
        self.settings: Settings | None = None

    def start(self) -> Settings:
        (self.data_dir / "stack.json").unlink(missing_ok=True)
        with open(self.data_dir.parent / "up.log", "ab") as log:
            self.up = subprocess.Popen(
                [sys.executable, "-m", "litstream.app.cli", "up", "--no-gateway", "--no-policy-server"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        info = until("the stack file", lambda: _stack_info(self.data_dir, self.up), timeout=60)
        self.settings = Settings(bootstrap_servers=info["bootstrap_servers"], topic_prefix=info["topic_prefix"],
                                 partitions=1, data_dir=self.data_dir, local_session_timeout_ms=6000)
        for role, key in (("lifecycle", None), ("span-sink", "inserted")):
            until(f"{role} ready", lambda r=role, k=key: _ready(self.data_dir, r, k), timeout=120)
        # `up` runs the triplet processor only with the trainer (--train): started beside it, with a runner
        env = {**self.env, "LITSTREAM_BOOTSTRAP_SERVERS": self.settings.bootstrap_servers}
        self.others = [self._spawn(env, "triplets", "process", "triplets"),
                       self._spawn(env, "runner", "runner", "--agent", "fault_agents:llm_call_or_stall_first",
                                   "--concurrency", "4", "--drain", "1")]
        until("triplets ready", lambda: _ready(self.data_dir, "triplets", None), timeout=120)
        return self.settings

    def _spawn(self, env: dict[str, str], name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.data_dir.parent / f"{name}.log", "ab") as log:
            return subprocess.Popen([sys.executable, "-m", "litstream.app.cli", *args], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def terminate(self) -> None:
        """What Ctrl-C does: every process is asked to stop and cleans up."""
        for proc in [*reversed(self.others), self.up]:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)

    def kill_all(self) -> None:
        """SIGKILL of every process of the stack at once: `up`, its children (broker, processors), the triplet
        processor and the runner."""
        assert self.up is not None
        pids = [self.up.pid, *(p.pid for p in self.others), *_descendants(self.up.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in [self.up, *self.others]:
            proc.wait(30)
        for pid in pids:
            until(f"process {pid} gone", lambda p=pid: not _exists(p), timeout=30)


def _exists(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _stack_info(data_dir: Path, up: subprocess.Popen[bytes] | None) -> dict[str, Any] | None:
    assert up is not None
    if up.poll() is not None:
        raise AssertionError(f"litstream up exited with code {up.returncode}; see {data_dir.parent / 'up.log'}")
    try:
        return dict(json.loads((data_dir / "stack.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _ready(data_dir: Path, role: str, key: str | None) -> bool:
    info = health.read(data_dir, role)
    return bool(info and info["alive"] and not info.get("starting") and (key is None or key in info))


def _records(settings: Settings) -> dict[tuple[str, int, int], tuple[bytes | None, bytes | None]]:
    """Every record of every topic of this prefix, by (topic, partition, offset)."""
    names = [t for t in admin(settings).list_topics(timeout=10).topics if t.startswith(settings.topic_prefix)]
    out = {}
    for topic in names:
        for m in read_to_end(settings, topic, timeout=120):
            out[(topic, m.partition(), m.offset())] = (m.key(), m.value())
    return out


def _committed(settings: Settings) -> dict[tuple[str, str, int], int]:
    """The committed offset of each processor's group on each topic of this prefix (one partition each)."""
    names = [t for t in admin(settings).list_topics(timeout=10).topics if t.startswith(settings.topic_prefix)]
    out = {}
    for group in GROUPS:
        c = consumer(settings, group_id=f"{settings.topic_prefix}-{group}")
        try:
            for tp in c.committed([TopicPartition(t, 0) for t in names], timeout=30):
                if tp.offset >= 0:
                    out[(group, tp.topic, tp.partition)] = tp.offset
        finally:
            c.close()
    return out


def _publish_resources(settings: Settings) -> None:
    events = EventProducer(settings, role="test")
    now = time.time()
    events.send(Topics(settings.topic_prefix).resources, ResourcesPublished(
        **EventFactory(role="publisher").stamp(), resources_id="rs-1", version=1, create_time=now, update_time=now,
        resources={"llm": NamedResourceRecord(resource_type="llm", endpoint="http://x/v1", model="m")}))
    events.flush()


def _finished(d: Driver, rids: list[str]) -> bool:
    snaps = d.view.catch_up()
    return all(r in snaps and snaps[r].status in FINISHED for r in rids)


def _run_until_in_flight(settings: Settings) -> tuple[list[str], list[str]]:
    """Rollouts that finish, and rollouts whose first attempt hangs: running when the stack stops."""
    _publish_resources(settings)
    d = Driver(settings)
    retry = {"max_attempts": 2, "retry_condition": ["unresponsive", "failed"], "unresponsive_seconds": 4.0}
    try:
        done = [d.enqueue({"n": i}, **retry) for i in range(3)]
        stalled = [d.enqueue({"stall": True, "n": i}, **retry) for i in range(2)]
        until("the quick rollouts finished", lambda: _finished(d, done), timeout=120)
        for rid in stalled:
            d.wait(rid, lambda s: s.status == "running", timeout=60)
    finally:
        d.close()
    return done, stalled


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[UpProcess]:
    up = UpProcess(tmp_path / "data", f"t{uuid.uuid4().hex[:10]}")
    try:
        yield up
    finally:
        up.kill_all() if up.up is not None and up.up.poll() is None else up.terminate()


# sigkill is an expected failure (xfail) that costs ~45 s: opt-in (LITSTREAM_SLOW=1) rather than run every time.
@pytest.mark.parametrize("stop", ["sigterm", pytest.param("sigkill", marks=[pytest.mark.slow, pytest.mark.xfail(
    strict=False, reason="noida-db 0.2.2 snapshots its log about a second after changes: a SIGKILL can lose the last "
    "second of acknowledged records (docs/durable-log.md); it failed in two of three full-suite runs")])])
def test_a_stack_stopped_mid_run_comes_back_with_everything(stack: UpProcess, stop: str) -> None:
    settings = stack.start()
    done, stalled = _run_until_in_flight(settings)
    stack.terminate() if stop == "sigterm" else stack.kill_all()

    # What the log holds at the stop, read with only the broker and its storage running.
    with EmbeddedLog("durable", stack.data_dir) as broker:
        at_stop = settings.model_copy(update={"bootstrap_servers": broker.bootstrap})
        records, committed = _records(at_stop), _committed(at_stop)
    assert committed, "the processors had committed offsets"

    settings = stack.start()
    d = Driver(settings)
    try:
        until("every rollout finished after the restart", lambda: _finished(d, done + stalled), timeout=180)
        snaps = d.view.catch_up()
    finally:
        d.close()
    for rid in stalled:  # the attempt in flight timed out (no heartbeat) or was released, then was retried
        assert [a.status for a in snaps[rid].attempts][-1] == "succeeded"
        assert len(snaps[rid].attempts) == 2 and snaps[rid].attempts[0].status in ("unresponsive", "failed")
    assert all(snaps[r].status == "succeeded" and len(snaps[r].attempts) == 1 for r in done)

    triplets_topic = f"{settings.topic_prefix}.triplets"
    until("a triplet for every rollout", lambda: sum(1 for _ in read_to_end(settings, triplets_topic))
          >= len(done) + len(stalled), timeout=60)
    after = _records(settings)
    assert {k: after.get(k) for k in records} == records  # every record at its offset, unchanged
    resumed = _committed(settings)
    assert all(resumed.get(k, -1) >= v for k, v in committed.items())  # no group went back to the start
    _, differences = verify(settings, wait_s=60)
    assert differences == []
    spans_on_topic = sum(1 for k in after if k[0] == f"{settings.topic_prefix}.spans")
    stack.terminate()
    assert log_files_bytes(stack.data_dir) > 0
    in_sql = int(query(f"chdb://{stack.data_dir / 'chdb'}", "SELECT count() FROM spans FINAL").rows[0][0])
    if stop == "sigterm":
        assert in_sql == spans_on_topic > 0
    else:  # the span sink may have stored spans written after the log's last snapshot
        assert in_sql >= spans_on_topic > 0


def test_a_full_disk_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="MB free on the disk of .*free some space"):
        check_free_space(tmp_path / "log", minimum=2**62)


def test_status_shows_the_disk_the_log_takes(tmp_path: Path) -> None:
    from rich.table import Table

    from litstream.app.cli import _log_disk_row

    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "kafka.json").write_bytes(b"x" * 3 * 2**20)
    table = Table("part", "state", "detail")
    _log_disk_row(table, Settings(data_dir=tmp_path))
    detail = str(table.columns[2]._cells[0])
    assert table.columns[0]._cells[0] == "disk" and detail.startswith("log 3.0 MB in ") and "free" in detail
