"""The pipeline on a three-broker Kafka cluster: topics at replication 3 with min.insync.replicas 2, and the broker
that leads most of the lifecycle events' partitions killed mid-run (SIGKILL). Nothing acknowledged is lost, the
processors carry on, and the killed broker, started again on its log dir, rejoins and catches up."""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from litstream.app.stack import Stack
from litstream.infra.broker import KafkaCluster
from litstream.infra.clickhouse import query
from litstream.infra.kafka import create_topics, read_to_end
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics, physical_topics
from litstream.schemas.codec import default_codec
from litstream.schemas.events import SpanRecorded
from litstream.schemas.models import FINISHED
from litstream.streams.replay import verify
from litstream.workers.client import enqueue_rollout
from tests.lifecycle_helpers import Driver
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPANS_PER_ROLLOUT = 6  # soak_agent's task["spans"]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[KafkaCluster]:
    with KafkaCluster(tmp_path / "cluster", size=3) as c:
        yield c


def _leaders(admin: AdminClient, topic: str) -> collections.Counter[int]:
    """How many of ``topic``'s partitions each broker leads."""
    meta = admin.list_topics(topic=topic, timeout=10).topics[topic]
    return collections.Counter(p.leader for p in meta.partitions.values())


def _replication(admin: AdminClient, topics: Iterable[str]) -> dict[str, set[tuple[int, int]]]:
    """Per topic, the distinct (replica count, in-sync count) of its partitions."""
    meta = admin.list_topics(timeout=10).topics
    return {t: {(len(p.replicas), len(p.isrs)) for p in meta[t].partitions.values()} for t in topics}


def _out_of_sync(admin: AdminClient, topics: Iterable[str], node: int) -> list[str]:
    """Partitions of ``topics`` that ``node`` replicates but is not in sync with."""
    meta = admin.list_topics(timeout=10).topics
    return [f"{t}[{n}]" for t in topics for n, p in meta[t].partitions.items()
            if node in p.replicas and node not in p.isrs]


def _min_isr(admin: AdminClient, topic: str) -> str:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    return str(configs["min.insync.replicas"].value)


def _enqueue(d: Driver, n: int, start: int) -> list[str]:
    """``n`` rollouts, sent with acks=all; returned once the brokers acknowledged every one (flush raises
    otherwise), so each returned id is a promise the pipeline must keep."""
    rids = [enqueue_rollout(d.events, {"spans": SPANS_PER_ROLLOUT, "i": start + i}).rollout_id for i in range(n)]
    d.events.flush(timeout=120)
    return rids


class Enqueuer:
    """Enqueues one rollout every ``every`` seconds on a thread, each acknowledged before the next, until
    stopped: the kill lands while rollouts are on their way through the pipeline."""

    def __init__(self, d: Driver, every: float = 0.3) -> None:
        self.d, self.every = d, every
        self.acked: list[str] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(self.every):
            try:
                self.acked += _enqueue(self.d, 1, i)
            except Exception as exc:  # noqa: BLE001 (the test reports it)
                self.errors.append(exc)
            i += 1

    def halt(self) -> None:
        self._stop.set()
        self._thread.join(timeout=150)

    def stop(self) -> list[str]:
        """Stop; every rollout it enqueued, each acknowledged (a failed enqueue fails the test)."""
        self.halt()
        assert not self._thread.is_alive() and not self.errors, self.errors
        return list(self.acked)


def _finished(d: Driver, rids: list[str]) -> dict[str, str]:
    snaps = d.view.catch_up()
    return {r: snaps[r].status for r in rids if r in snaps and snaps[r].status in FINISHED}


def _spans_on_topic(settings: Settings) -> dict[str, set[str]]:
    codec = default_codec()
    out: dict[str, set[str]] = collections.defaultdict(set)
    for msg in read_to_end(settings, Topics(settings.topic_prefix).spans, timeout=60):
        span = codec.decode_as(msg.value(), SpanRecorded)
        out[span.meta.rollout_id].add(span.span_id)
    return out


def _spans_in_clickhouse(settings: Settings) -> dict[str, set[str]]:
    out: dict[str, set[str]] = collections.defaultdict(set)
    for rid, span_id in query(settings.resolved_clickhouse_dsn, "SELECT rollout_id, SpanId FROM spans FINAL").rows:
        out[str(rid)].add(str(span_id))
    return out


def test_a_killed_leader_loses_nothing_and_rejoins(cluster: KafkaCluster, tmp_path: Path) -> None:
    settings = Settings(bootstrap_servers=cluster.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=4,
                        data_dir=tmp_path / "data", clickhouse_dsn=f"chdb://{tmp_path / 'chdb'}")
    create_topics(settings)
    topics = [t.name for t in physical_topics(settings)]
    admin = cluster.admin()
    assert _replication(admin, topics) == {t: {(3, 3)} for t in topics}  # the broker default: create_topics asks -1
    assert {_min_isr(admin, t) for t in topics} == {"2"}
    events_topic = Topics(settings.topic_prefix).rollout_events

    with Stack(settings) as stack:
        stack.start("lifecycle", "process", "lifecycle")
        stack.start("span-sink", "process", "span-sink")
        stack.start("runner", "runner", "--concurrency", "2", "--agent", "bench.soak:soak_agent")
        stack.wait_ready("lifecycle", "lifecycle", timeout=120)
        stack.wait_ready("span-sink", "span-sink", key="inserted", timeout=120)
        pids = {name: role.proc.pid for name, role in stack.roles.items()}
        d = Driver(settings)
        enqueuer = Enqueuer(d)
        try:
            until("some rollouts done, before the kill", lambda: len(_finished(d, enqueuer.acked)) >= 5, timeout=120)
            victim = _leaders(admin, events_topic).most_common(1)[0][0]
            burst = _enqueue(d, 20, 1000)  # acknowledged just now: on their way through the pipeline at the kill
            killed_at = time.time()
            cluster.kill(victim)
            at_kill = len(enqueuer.acked)
            # Enqueues go on: stalled until the controller fences the dead broker and its partitions get new
            # leaders among the two others in sync, then acknowledged by those two (min.insync.replicas=2).
            until("rollouts acknowledged with a broker down", lambda: len(enqueuer.acked) >= at_kill + 20,
                  timeout=120)
            assert victim not in _leaders(admin, events_topic)
            enqueued = burst + enqueuer.stop()
            until("every acknowledged rollout finished with a broker down",
                  lambda: len(_finished(d, enqueued)) == len(enqueued), timeout=180)

            cluster.start_node(victim)  # the same log dir: it rejoins and fetches what it missed
            internal = ["__consumer_offsets"]
            until("the restarted broker back in sync everywhere",
                  lambda: not _out_of_sync(admin, topics + internal, victim), timeout=180, every=1.0)
            after = _enqueue(d, 6, 200)
            until("the rollouts after the rejoin finished",
                  lambda: len(_finished(d, after)) == len(after), timeout=120)
            rids = enqueued + after
            statuses = _finished(d, rids)
            snaps = d.view.catch_up()
        finally:
            enqueuer.halt()
            d.close()

        assert statuses == {r: "succeeded" for r in rids}
        assert any((snaps[r].end_time or 0) > killed_at for r in burst)  # the kill did land mid-run
        _, differences = verify(settings, wait_s=60)  # the live state is the fold of the whole log
        assert differences == []
        assert _replication(admin, topics + internal) == {t: {(3, 3)} for t in topics + internal}
        keys = {m.key().decode() for m in read_to_end(settings, events_topic, timeout=60)}
        assert set(rids) <= keys
        on_topic = _spans_on_topic(settings)
        assert all(len(on_topic[r]) >= SPANS_PER_ROLLOUT for r in rids), {r: len(on_topic[r]) for r in rids}
        until("every span on the topic in ClickHouse", lambda: _spans_in_clickhouse(settings) == on_topic,
              timeout=120, every=1.0)
        # The processors carried on: the same processes, none restarted.
        assert {name: role.proc.pid for name, role in stack.roles.items() if role.alive()} == pids
