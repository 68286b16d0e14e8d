"""The embedded broker's durable log (Apache Kafka, its log under ``<data_dir>/kafka``): what survives which
stop, compaction that really runs, the disk per topic in `litstream status`, and a full disk.

The restart test runs the stack as a person does: `litstream up` (durable, the default) in a data dir, with a
triplet processor and a runner started beside it, rollouts finished and rollouts in flight. It stops
everything with Ctrl-C, starts again in the same data dir, puts more rollouts in flight, SIGKILLs every
process (the broker's JVM too) and starts again. What the log holds is read after the Ctrl-C with only the
broker running on it, and just before the SIGKILL from the live broker (all of it acknowledged, then). After
each start all of it must be there: every record of every topic at its offset, no group's committed offset
gone back, the rollouts in flight retried as their config says, `litstream replay --verify` equal to the live
table, one triplet per rollout, the resources version, the spans in chDB equal to the spans topic, and
`litstream status` showing the disk per topic.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from litstream.app.stack import Stack
from litstream.infra import health
from litstream.infra.broker import BrokerError, KafkaBroker, check_free_space
from litstream.infra.kafka import admin, consumer, create_topics, read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.infra.topics import COMPACTED_SEGMENT_MS, DAY_MS, Topics
from litstream.schemas.codec import default_codec
from litstream.schemas.events import EventFactory, NamedResourceRecord, ResourcesPublished, TripletEmitted
from litstream.schemas.models import FINISHED
from litstream.streams.replay import verify
from litstream.streams.views import ResourcesView
from tests.lifecycle_helpers import Driver
from tests.waiting import until

TESTS_DIR = str(Path(__file__).parent)
# Retried once when an attempt fails (its runner released it) or goes 4 s without a heartbeat (runner dead).
RETRY: dict[str, Any] = {"max_attempts": 2, "retry_condition": ["unresponsive", "failed"],
                         "unresponsive_seconds": 4.0}
Records = dict[tuple[str, int, int], tuple[bytes | None, bytes | None]]


# --- the stack as a person runs it --------------------------------------------------------------------------

class UserStack:
    """`litstream up` in a data dir, with a triplet processor and a runner beside it (another shell)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LITSTREAM_")}
        self.env.update({"LITSTREAM_DATA_DIR": str(self.data_dir), "LITSTREAM_BROKER_STORAGE": "durable",
                         "LITSTREAM_PARTITIONS": "1", "LITSTREAM_SESSION_TIMEOUT_MS": "3000",
                         "OMP_NUM_THREADS": "1", "COLUMNS": "250",
                         "PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")])})
        self.up: subprocess.Popen[bytes] | None = None
        self.beside: list[subprocess.Popen[bytes]] = []
        self.settings = Settings(data_dir=self.data_dir)

    def start(self) -> Settings:
        for beat in (self.data_dir / "health").glob("*.json"):
            beat.unlink()  # ready then means ready in this start
        with open(self.root / "up.log", "ab") as log:
            self.up = subprocess.Popen([sys.executable, "-m", "litstream.app.cli", "up", "--no-gateway",
                                        "--no-policy-server"], cwd=self.root, env=self.env, stdout=log,
                                       stderr=subprocess.STDOUT)
        info = until("the stack file", self._stack_info, timeout=120)
        self.settings = Settings(bootstrap_servers=info["bootstrap_servers"], data_dir=self.data_dir,
                                 topic_prefix=info["topic_prefix"], partitions=info["partitions"])
        until("the lifecycle processor and the span sink", lambda: self._ready("lifecycle")
              and self._ready("span-sink", "inserted"), timeout=180)
        self.beside = [self._spawn("triplets", "process", "triplets"),
                       self._spawn("runner", "runner", "--agent", "fault_agents:llm_call_or_stall_first",
                                   "--concurrency", "4", "--drain", "1")]
        until("the triplet processor", lambda: self._ready("triplets"), timeout=120)
        return self.settings

    def _stack_info(self) -> dict[str, Any] | None:
        assert self.up is not None
        if self.up.poll() is not None:
            raise AssertionError(f"litstream up exited with code {self.up.returncode}; "
                                 f"see {self.root / 'up.log'}")
        try:
            info = dict(json.loads((self.data_dir / "stack.json").read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return info if info.get("pid") == self.up.pid else None  # not the one a killed `up` left behind

    def _ready(self, role: str, key: str | None = None) -> bool:
        info = health.read(self.data_dir, role)
        return bool(info and info["alive"] and not info.get("starting") and (key is None or key in info))

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.root / f"{name}.log", "ab") as log:
            return subprocess.Popen([sys.executable, "-m", "litstream.app.cli", *args], cwd=self.root,
                                    env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "litstream.app.cli", *args], capture_output=True,
                              text=True, timeout=timeout, cwd=self.root, env=self.env)

    def ctrl_c(self) -> None:
        """Ctrl-C in each shell: the runner releases its attempts in flight; `up` stops its processors, then
        the broker (a controlled shutdown)."""
        assert self.up is not None
        for proc in self.beside:
            proc.send_signal(signal.SIGTERM)
        for proc in self.beside:
            proc.wait(60)
        self.up.send_signal(signal.SIGINT)
        assert self.up.wait(90) == 0

    def kill_everything(self) -> list[int]:
        """SIGKILL of every process of the stack: `up`, the broker's JVM and the processors `up` started (each
        in a session of its own), the triplet processor and the runner. The three at the top are stopped
        first, so that none starts another process in between. Returns the pids killed."""
        assert self.up is not None
        tops = [self.up.pid, *(p.pid for p in self.beside)]
        _signal(tops, signal.SIGSTOP)
        pids = tops + [child for pid in tops for child in _descendants(pid)]
        _signal(pids, signal.SIGKILL)
        for proc in [self.up, *self.beside]:
            proc.wait(30)
        for pid in pids:
            until(f"process {pid} gone", lambda p=pid: not _exists(p), timeout=30)
        return pids

    def close(self) -> None:
        procs = [p for p in [*self.beside, self.up] if p is not None and p.poll() is None]
        for proc in procs:
            proc.send_signal(signal.SIGINT if proc is self.up else signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                self.kill_everything()
                return


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _exists(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _broker_pid(data_dir: Path) -> int:
    """The JVM running the broker whose properties are in ``data_dir``'s log."""
    props = str((data_dir / "kafka" / "server.properties").resolve())
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if props in cmdline.read_bytes().decode(errors="replace").split("\0"):
                return int(cmdline.parent.name)
        except OSError:
            continue
    raise AssertionError(f"no broker runs with {props}")


# --- what the log holds -------------------------------------------------------------------------------------

@dataclass
class LogContents:
    records: Records
    ends: dict[tuple[str, int], int]  # high-water mark per partition
    committed: dict[tuple[str, str, int], int]  # (group, topic, partition) -> committed offset


def _topics(settings: Settings) -> dict[str, list[int]]:
    meta = admin(settings).list_topics(timeout=10).topics
    return {name: sorted(t.partitions) for name, t in meta.items() if not name.startswith("__")}


def _records(settings: Settings, timeout: float = 120) -> Records:
    """Every record of every topic, by (topic, partition, offset), read to the ends by one consumer."""
    parts = [TopicPartition(t, p, 0) for t, ps in _topics(settings).items() for p in ps]
    c = consumer(settings, group_id=f"all-{uuid.uuid4().hex[:8]}", **{"enable.partition.eof": True})
    out: Records = {}
    at_end: set[tuple[str, int]] = set()
    deadline = time.monotonic() + timeout
    try:
        c.assign(parts)
        while len(at_end) < len(parts):
            assert time.monotonic() < deadline, f"reading every topic took over {timeout:.0f}s"
            for m in c.consume(1000, 0.2):
                tp, err = (str(m.topic()), int(m.partition() or 0)), m.error()
                if err is None:
                    out[(*tp, int(m.offset() or 0))] = (m.key(), m.value())
                    at_end.discard(tp)
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(tp)
                else:
                    raise KafkaException(err)
    finally:
        c.close()
    return out


def _ends(settings: Settings) -> dict[tuple[str, int], int]:
    c = consumer(settings, group_id=f"ends-{uuid.uuid4().hex[:8]}")
    try:
        return {(t, p): c.get_watermark_offsets(TopicPartition(t, p), timeout=30)[1]
                for t, parts in _topics(settings).items() for p in parts}
    finally:
        c.close()


def _committed(settings: Settings) -> dict[tuple[str, str, int], int]:
    """Every consumer group's committed offsets."""
    client = admin(settings)
    groups = [g.group_id for g in client.list_consumer_groups(request_timeout=30).result().valid]
    out = {}
    for group in groups:
        request = [ConsumerGroupTopicPartitions(group)]
        for fut in client.list_consumer_group_offsets(request, request_timeout=30).values():
            for tp in fut.result().topic_partitions or []:
                if tp.offset >= 0:
                    out[(group, tp.topic, tp.partition)] = tp.offset
    return out


def _contents(settings: Settings) -> LogContents:
    return LogContents(_records(settings), _ends(settings), _committed(settings))


def _log_alone(stack: UserStack) -> LogContents:
    """What the log holds, read with only the broker running on it."""
    with KafkaBroker(stack.data_dir / "kafka", log_path=stack.root / "broker-alone.log") as broker:
        return _contents(stack.settings.model_copy(update={"bootstrap_servers": broker.bootstrap}))


def _assert_all_there(before: LogContents, after: LogContents) -> None:
    assert {k: after.records.get(k) for k in before.records} == before.records  # at its offset, unchanged
    assert all(after.ends.get(tp, -1) >= end for tp, end in before.ends.items())
    gone_back = {k: (v, after.committed.get(k)) for k, v in before.committed.items()
                 if after.committed.get(k, -1) < v}
    assert not gone_back, f"committed offsets went back: {gone_back}"


# --- rollouts -----------------------------------------------------------------------------------------------

@dataclass
class Round:
    """Rollouts enqueued before one stop: some finished, some with an attempt running when it came."""

    first_attempt: str  # what the stop makes of the attempts in flight
    done: list[str] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)


def _publish_resources(settings: Settings, version: int) -> None:
    events = EventProducer(settings, role="test")
    now = time.time()
    events.send(Topics(settings.topic_prefix).resources, ResourcesPublished(
        **EventFactory(role="publisher").stamp(), resources_id="rs-1", version=version, create_time=now,
        update_time=now, resources={"llm": NamedResourceRecord(resource_type="llm", model="m",
                                                               endpoint=f"http://x/{version}")}))
    events.flush()
    events.close()


def _finished(d: Driver, rids: list[str]) -> bool:
    snaps = d.view.catch_up()
    return all(r in snaps and snaps[r].status in FINISHED for r in rids)


def _run_until_in_flight(settings: Settings, first_attempt: str, version: int) -> Round:
    """A resources version, two rollouts that finish and two whose first attempt hangs (at the stop)."""
    _publish_resources(settings, version)
    rnd = Round(first_attempt)
    d = Driver(settings)
    try:
        rnd.done = [d.enqueue({"n": i}, **RETRY) for i in range(2)]
        rnd.in_flight = [d.enqueue({"stall": True, "n": i}, **RETRY) for i in range(2)]
        until("the quick rollouts finished", lambda: _finished(d, rnd.done), timeout=120)
        for rid in rnd.in_flight:
            d.wait(rid, lambda s: s.status == "running", timeout=90)
    finally:
        d.close()
    return rnd


def _assert_rollouts_as_configured(stack: UserStack, rounds: list[Round]) -> None:
    """Every rollout finished, read back with `litstream rollouts`: the quick ones at their first attempt, the
    ones in flight at their second, after a first that the stop failed (released) or made unresponsive."""
    d = Driver(stack.settings)
    try:
        rids = [r for x in rounds for r in x.done + x.in_flight]
        until("every rollout finished", lambda: _finished(d, rids), timeout=180)
    finally:
        d.close()
    out = stack.cli("rollouts", "--json")
    assert out.returncode == 0, out.stderr
    snaps = {s["rollout_id"]: s for s in map(json.loads, out.stdout.splitlines())}
    for rnd in rounds:
        for rid in rnd.done:
            assert [a["status"] for a in snaps[rid]["attempts"]] == ["succeeded"], snaps[rid]
        for rid in rnd.in_flight:
            statuses = [a["status"] for a in snaps[rid]["attempts"]]
            assert statuses == [rnd.first_attempt, "succeeded"], snaps[rid]
        assert all(snaps[r]["status"] == "succeeded" for r in rnd.done + rnd.in_flight)
    assert len(snaps) == sum(len(x.done + x.in_flight) for x in rounds)


def _assert_derived_state(stack: UserStack, rounds: list[Round]) -> None:
    """Replay equals the live table; one triplet per rollout; the latest resources version; chDB's spans equal
    the spans topic; `litstream status` shows the disk per topic."""
    settings, topics = stack.settings, Topics(stack.settings.topic_prefix)
    out = stack.cli("replay", "--verify", "--json", "--wait", "60")
    assert out.returncode == 0, out.stderr
    rollouts = [r for x in rounds for r in x.done + x.in_flight]
    summary = json.loads(out.stdout)
    assert (summary["verified"], summary["rollouts"], summary["by_status"]) == (True, len(rollouts),
                                                                                 {"succeeded": len(rollouts)})
    codec = default_codec()

    def triplets() -> set[str]:
        return {codec.decode_as(m.value(), TripletEmitted).meta.rollout_id
                for m in read_to_end(settings, topics.triplets)}

    until("a triplet for every rollout", lambda: triplets() >= set(rollouts), timeout=90)
    view = ResourcesView(settings, codec)
    try:
        assert view.caught_up(60) and view.state.by_id["rs-1"].version == len(rounds)
    finally:
        view.close()
    spans = sum(1 for _ in read_to_end(settings, topics.spans))
    until("chDB has every span of the topic",
          lambda: _sql(stack, "SELECT count() FROM spans FINAL") == str(spans), timeout=90, every=1.0)
    status = stack.cli("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert all(row in status.stdout for row in ("disk by topic", "rollout-events", "kafka's own"))


def _sql(stack: UserStack, query: str) -> str:
    out = stack.cli("sql", query, "--format", "csv")
    return out.stdout.splitlines()[1] if out.returncode == 0 else f"error: {out.stderr}"


# --- restart without loss -----------------------------------------------------------------------------------

@pytest.fixture
def user_stack(tmp_path: Path) -> Iterator[UserStack]:
    stack = UserStack(tmp_path)
    try:
        yield stack
    finally:
        stack.close()


@pytest.mark.slow(enabled_by="LITSTREAM_LONG_RUNS")  # a minute or more; CI runs it (.ci/run)
def test_a_stack_stopped_by_ctrl_c_or_killed_comes_back_with_everything(user_stack: UserStack) -> None:
    stack = user_stack
    stack.start()
    first = _run_until_in_flight(stack.settings, "failed", version=1)
    stack.ctrl_c()
    at_stop = _log_alone(stack)
    prefix = stack.settings.topic_prefix
    groups = {f"{prefix}-{role}" for role in ("lifecycle", "span-sink", "triplets", "runners")}
    assert groups <= {group for group, _, _ in at_stop.committed}, at_stop.committed
    stack.start()
    _assert_all_there(at_stop, _contents(stack.settings))
    _assert_rollouts_as_configured(stack, [first])
    _assert_derived_state(stack, [first])

    second = _run_until_in_flight(stack.settings, "unresponsive", version=2)
    acknowledged = _contents(stack.settings)  # what the live broker serves: acknowledged, records and commits
    broker = _broker_pid(stack.data_dir)
    assert broker in stack.kill_everything()
    stack.start()
    _assert_all_there(acknowledged, _contents(stack.settings))
    _assert_rollouts_as_configured(stack, [first, second])
    _assert_derived_state(stack, [first, second])
    topics = Topics(stack.settings.topic_prefix)
    held = {t for t, _, _ in acknowledged.records}
    assert {topics.rollout_events, topics.spans, topics.offers, topics.state, topics.resources,
            topics.triplets, topics.workers, topics.lifecycle_changelog} <= held


# --- compaction ---------------------------------------------------------------------------------------------

BEATS = 25  # heartbeats per rollout: a new version of its state with each


def _alter(settings: Settings, kind: ResourceType, name: str, op: AlterConfigOpType, **config: str) -> None:
    entries = [ConfigEntry(k.replace("_", "."), v, incremental_operation=op) for k, v in config.items()]
    client = admin(settings)  # kept until the answer came: a client collected meanwhile fails its requests
    resource = ConfigResource(kind, name, incremental_configs=entries)
    client.incremental_alter_configs([resource])[resource].result()


@pytest.fixture
def eager_cleaner(broker: KafkaBroker, tmp_path: Path) -> Iterator[Settings]:
    """Topics of one partition on the shared test broker, whose log cleaner looks for work every 200 ms
    instead of Kafka's 15 s (log.cleaner.backoff.ms, a dynamic broker setting) until the test ends."""
    single = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                      partitions=1, data_dir=tmp_path / "data", clickhouse_dsn=f"chdb://{tmp_path / 'chdb'}")
    create_topics(single)
    node = str(broker.node_id)
    _alter(single, ResourceType.BROKER, node, AlterConfigOpType.SET, log_cleaner_backoff_ms="200")
    try:
        yield single
    finally:
        _alter(single, ResourceType.BROKER, node, AlterConfigOpType.DELETE, log_cleaner_backoff_ms="")


def _config(settings: Settings, topic: str) -> dict[str, str]:
    res, client = ConfigResource(ResourceType.TOPIC, topic), admin(settings)
    return {k: v.value for k, v in client.describe_configs([res])[res].result().items()}


def _versions(settings: Settings, topic: str) -> dict[str, list[tuple[int, bytes | None]]]:
    """Each key's versions, oldest first, with their offsets. Keys as text: the changelog's are JSON strings
    (Faust's key serializer), the others the bare rollout id."""
    out: dict[str, list[tuple[int, bytes | None]]] = {}
    for m in read_to_end(settings, topic):
        key = (m.key() or b"").decode()
        text = json.loads(key) if key.startswith('"') else key
        out.setdefault(text, []).append((int(m.offset() or 0), m.value()))
    return out


def _many_versions(d: Driver) -> tuple[list[str], str]:
    """Three rollouts, each claimed and beaten BEATS times; two finish, one is left running."""
    rids = [d.enqueue({"n": i}) for i in range(3)]
    for rid in rids:
        d.claim(rid, 1, f"at-{rid}")
        for _ in range(BEATS):
            d.beat(rid, f"at-{rid}")
    for rid in rids[:2]:
        d.finish(rid, f"at-{rid}", "succeeded")
    for rid, status in zip(rids, ("succeeded", "succeeded", "running"), strict=True):
        d.wait(rid, _with_status(status), timeout=90)
    return rids[:2], rids[2]


def _with_status(status: str) -> Any:
    return lambda s: (s.status == status and len(s.attempts) == 1
                      and s.attempts[0].last_heartbeat_time is not None)


def _assert_catalogue_configs(settings: Settings) -> None:
    """As the catalogue creates them: state compacted, a segment closed every hour; workers kept a week."""
    topics = Topics(settings.topic_prefix)
    for name in (topics.state, topics.lifecycle_changelog):
        config = _config(settings, name)
        assert (config["cleanup.policy"], config["segment.ms"]) == ("compact", str(COMPACTED_SEGMENT_MS))
    workers = _config(settings, topics.workers)
    assert (workers["cleanup.policy"], workers["retention.ms"]) == ("delete", str(7 * DAY_MS))
    assert _config(settings, topics.offers)["segment.ms"] == str(DAY_MS)


def test_state_topics_are_compacted_and_rebuild_the_same_state(eager_cleaner: Settings) -> None:
    settings, topics = eager_cleaner, Topics(eager_cleaner.topic_prefix)
    compacted = (topics.state, topics.lifecycle_changelog)
    _assert_catalogue_configs(settings)
    with Stack(settings) as stack:
        stack.start("lifecycle", "process", "lifecycle")
        stack.wait_ready("lifecycle", "lifecycle")
        d = Driver(settings)
        try:
            finished, running = _many_versions(d)
            before = {name: _versions(settings, name) for name in compacted}
            assert all(len(before[name][rid]) > BEATS for name in compacted for rid in finished)
            # From now on segments close 100 ms after they open, and are cleaned however little is dirty.
            for name in compacted:
                _alter(settings, ResourceType.TOPIC, name, AlterConfigOpType.SET, segment_ms="100",
                       min_cleanable_dirty_ratio="0.01", min_compaction_lag_ms="0")
            until("the new segment.ms in effect",
                  lambda: all(_config(settings, name)["segment.ms"] == "100" for name in compacted), timeout=30)
            time.sleep(0.3)  # only closed segments are cleaned: the next record closes the one open till now
            marker = d.enqueue({"marker": True})
            d.wait(marker, lambda s: s.status == "queuing")
            after = until("the log cleaner ran", lambda: _once_per_key(settings, compacted), timeout=90)
            for name in compacted:  # each key's newest version is kept, at its offset; the others are gone
                assert {k: v for k, v in after[name].items() if k != marker} == \
                    {k: [versions[-1]] for k, versions in before[name].items()}
            _, differences = verify(settings, wait_s=30)  # the live view reads the compacted rollout-state
            assert differences == []

            # The lifecycle processor rebuilds its table from the compacted changelog (no local copy left),
            # and folds the running rollout's next events onto it exactly as a replay of every event does.
            stack.roles["lifecycle"].stop()
            shutil.rmtree(settings.data_dir / "faust")
            stack.start("lifecycle", "process", "lifecycle")
            stack.wait_ready("lifecycle", "lifecycle")
            d.beat(running, f"at-{running}")
            d.finish(running, f"at-{running}", "succeeded")
            d.wait(running, lambda s: s.status == "succeeded", timeout=90)
            _, differences = verify(settings, wait_s=30)
            assert differences == []
        finally:
            d.close()


def _once_per_key(settings: Settings, names: tuple[str, ...]) -> dict[str, dict[str, list[Any]]] | None:
    found = {name: _versions(settings, name) for name in names}
    return found if all(len(v) == 1 for versions in found.values() for v in versions.values()) else None


# --- disk: per topic in `litstream status`, a full disk -----------------------------------------------------

def test_status_shows_the_disk_each_topic_takes(tmp_path: Path) -> None:
    from rich.table import Table

    from litstream.app.cli import _log_disk_row

    log = tmp_path / "kafka" / "data"
    for part, mib in (("p.spans-0", 2), ("p.spans-1", 1), ("p.rollout-events-0", 1),
                      ("__consumer_offsets-3", 1), ("p-lifecycle-rollouts-changelog-0", 1),
                      ("p.spans-2.6a4f-delete", 5)):  # a topic being deleted: on the disk, not a topic
        (log / part).mkdir(parents=True)
        (log / part / "00000000000000000000.log").write_bytes(b"x" * mib * 2**20)
    with open(log / "p.rollout-events-0" / "00000000000000000000.index", "wb") as sparse:
        sparse.truncate(10 * 2**20)  # preallocated, as Kafka does its index files: takes no disk
    table = Table("part", "state", "detail")
    _log_disk_row(table, Settings(data_dir=tmp_path, topic_prefix="p"))
    rows = {str(table.columns[0]._cells[i]): str(table.columns[2]._cells[i]) for i in range(table.row_count)}
    assert rows["disk"].startswith("kafka 11.0 MB in ") and "free" in rows["disk"]
    assert rows["disk by topic"] == ("spans 3.0 MB, kafka's own 1.0 MB, lifecycle-rollouts-changelog 1.0 MB, "
                                     "rollout-events 1.0 MB")


def test_a_full_disk_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match=r"^only \d+ MB free on the disk of .*: free some space"):
        check_free_space(tmp_path / "log", minimum=2**62)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """``<tmp>/data/kafka``, where the broker's log goes, on a 300 MB tmpfs (the stack's logs stay out)."""
    mount = tmp_path / "data" / "kafka"
    mount.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path, leave: int) -> Path:
    filler = path / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(path).free - leave)
    return filler


def _produce_until_the_broker_stops(settings: Settings, stack: Stack, topic: str) -> dict[int, bytes]:
    """Records of 64 KiB until the broker is gone; returns the acknowledged ones by offset."""
    acked: dict[int, bytes] = {}

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            acked[int(msg.offset())] = msg.value()

    p = Producer({"bootstrap.servers": settings.bootstrap_servers, "acks": "all", "enable.idempotence": True,
                  "message.timeout.ms": 5000, "log_level": 0})
    assert stack.broker is not None
    for i in range(2000):
        if not stack.broker.alive():
            break
        p.produce(topic, key=b"k", value=f"{i:08d}".encode() * 8192, on_delivery=delivered)
        p.poll(0.01)
    p.flush(15)
    return acked


def test_a_full_disk_stops_the_broker_in_one_line_and_damages_nothing(small_disk: Path,
                                                                      tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", topic_prefix="full", partitions=1,
                        broker_storage="durable", clickhouse_dsn=f"chdb://{tmp_path / 'chdb'}")
    topic = Topics(settings.topic_prefix).spans
    stack = Stack(settings)
    try:
        stack.start_broker()
        stack.create_topics()
        filler = _fill(small_disk, leave=2 * 2**20)
        acked = _produce_until_the_broker_stops(stack.settings, stack, topic)

        def broker_error() -> str | None:
            try:
                stack.supervise()
            except RuntimeError as exc:
                return str(exc)
            return None

        said = until("the stack saw the broker stop", broker_error, timeout=120)
        assert "\n" not in said and "the disk is full" in said, said
        assert str(stack.log_dir / "broker.log") in said, said
    finally:
        stack.stop()
    # Started again on the full disk: refused before the broker runs, in one line naming the log's directory.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITSTREAM_")}
    up = subprocess.run([sys.executable, "-m", "litstream.app.cli", "up", "--no-gateway",
                         "--no-policy-server"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                        env={**env, "LITSTREAM_DATA_DIR": str(settings.data_dir), "COLUMNS": "100"})
    assert up.returncode == 1
    assert up.stderr.startswith("error: only ") and len(up.stderr.strip().splitlines()) == 1, up.stderr
    assert f"MB free on the disk of {small_disk}" in up.stderr
    # With space again, the broker recovers its log: every acknowledged record is there, unchanged.
    filler.unlink()
    with Stack(settings) as again:
        again.start_broker()
        kept = {int(m.offset() or 0): m.value() for m in read_to_end(again.settings, topic, timeout=60)}
    assert acked and {o: kept.get(o) for o in acked} == acked
