"""broker_storage: the embedded broker's storage candidates side by side, in one run (the machine is shared, so
compare ratios within a run).

For each candidate: produce and consume rates (200-byte values, 3 partitions, the project's producer settings),
the latency of one record from produce to a group consumer (p50/p99, the local profile's fetch wait), the
broker's RSS (with its storage server) after the log is written, whether records and committed offsets survive
a restart of every process, and whether two members of one group (confluent-kafka, then aiokafka) both get
partitions. Candidates whose program is not installed are reported as such, not failed:
- Tansu ``memory://`` (today's ephemeral mode);
- Tansu ``s3://`` over moto (in memory: survives a broker restart only), s3rver (files) and local-s3-server (files);
- noida-db 0.2.2 (the opt-in durable log; 0.2.3 has the same limits, docs/durable-log.md).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from litstream.infra.broker import EmbeddedBroker, free_port
from litstream.infra.kafka import consumer, create_topics, flush_or_raise, producer, read_to_end
from litstream.infra.log_storage import NoidaBroker, S3Server
from litstream.infra.settings import Settings

from .harness import Context, Report, Row

TITLE = "the embedded broker's storage: memory, s3:// over loopback S3 servers, noida-db"
VALUE = b"x" * 200
PARTITIONS = 3


@dataclass
class Candidate:
    """One broker setup that can be started, stopped and started again on the same storage."""

    name: str
    root: Path
    fetch_wait_ms: int = 10
    server: S3Server | None = None
    broker: EmbeddedBroker | None = None
    port: int = field(default_factory=free_port)

    def start(self) -> str:
        if self.name == "noida-db":
            return self._start_noida()
        storage = "memory://tansu/"
        env: dict[str, str] = {}
        if self.name != "memory":
            kind = self.name.removeprefix("s3/")
            self.server = S3Server(self.root / kind, kind=kind, port=self.server.port if self.server else free_port(),
                                   log_path=self.root / f"{kind}.log").start()
            storage, env = "s3://tansu/", self.server.broker_env()
        self.broker = EmbeddedBroker(port=self.port, storage=storage, env=env, log_path=self.root / "broker.log")
        return self.broker.start().bootstrap

    def _start_noida(self) -> str:
        self.broker = NoidaBroker(self.root / "noida", port=self.port, log_path=self.root / "noida.log")
        return self.broker.start().bootstrap

    def pids(self) -> list[int]:
        procs = [self.broker.proc if self.broker else None, self.server.proc if self.server else None]
        pids = [p.pid for p in procs if p is not None and p.poll() is None]
        return pids + [c for pid in pids for c in _children(pid)]

    def kill(self) -> None:
        for part in (self.broker, self.server):
            if part is not None:
                part.kill()

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()
        if self.server is not None:
            self.server.stop()


def _children(pid: int) -> list[int]:
    """Direct children (noida-db's launcher runs the server as its child)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def _produce(settings: Settings, topic: str, n: int) -> float:
    p = producer(settings)
    p.produce(topic, VALUE, key=b"warm")  # connections and the producer id before the clock starts
    flush_or_raise(p)
    start = time.perf_counter()
    for i in range(n):
        p.produce(topic, VALUE, key=str(i % 50).encode())
        if i % 10_000 == 0:
            p.poll(0)
    flush_or_raise(p, timeout=600)
    return time.perf_counter() - start


def _consume(settings: Settings, topic: str) -> tuple[int, float]:
    next(iter(read_to_end(settings, f"{settings.topic_prefix}.resources")), None)  # metadata, connections
    start = time.perf_counter()
    n = sum(1 for _ in read_to_end(settings, topic, timeout=600))
    return n, time.perf_counter() - start


def _latency(settings: Settings, topic: str, samples: int) -> list[float]:
    """Seconds from a produce to its arrival at a group member, one record at a time."""
    c = consumer(settings, group_id=f"lat-{uuid.uuid4().hex[:6]}", **{"auto.offset.reset": "earliest"})
    p = producer(settings)
    out: list[float] = []
    try:
        c.subscribe([topic])
        p.produce(topic, b"warm")
        flush_or_raise(p)
        _poll_until(c, lambda v: v == b"warm", 60)
        for i in range(samples):
            marker = f"m{i}".encode()
            start = time.perf_counter()
            p.produce(topic, marker)
            p.poll(0)
            _poll_until(c, marker.__eq__, 30)
            out.append(time.perf_counter() - start)
    finally:
        c.close()
        p.flush(5)
    return out


def _poll_until(c: Any, match: Callable[[bytes | None], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = c.poll(0.05)
        if msg is not None and msg.error() is None and match(msg.value()):
            return
    raise TimeoutError("record not seen")


def _commit_half(settings: Settings, topic: str) -> dict[int, int]:
    """Commit, per partition, the offset half-way through what the partition holds."""
    c = consumer(settings, group_id="bench-restart")
    ends: dict[int, int] = {}
    for msg in read_to_end(settings, topic, timeout=600):
        ends[int(msg.partition() or 0)] = int(msg.offset() or 0) + 1
    offsets = {p: e // 2 for p, e in ends.items()}
    c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    c.close()
    return offsets


def _committed(settings: Settings, topic: str) -> dict[int, int]:
    c = consumer(settings, group_id="bench-restart")
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
        return {tp.partition: tp.offset for tp in got if tp.offset >= 0}
    finally:
        c.close()


def _two_members_confluent(settings: Settings, topic: str, timeout: float = 40) -> bool:
    group = f"two-{uuid.uuid4().hex[:6]}"
    members = [consumer(settings, group_id=group) for _ in range(2)]
    try:
        for m in members:
            m.subscribe([topic])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in members:
                m.poll(0.1)
            if all(m.assignment() for m in members):
                return True
        return False
    finally:
        for m in members:
            m.close()


def _two_members_aiokafka(bootstrap: str, topic: str, timeout: float = 40) -> bool:
    from aiokafka import AIOKafkaConsumer

    async def run() -> bool:
        group = f"two-aio-{uuid.uuid4().hex[:6]}"
        members = [AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, session_timeout_ms=6000,
                                    heartbeat_interval_ms=500) for _ in range(2)]
        for m in members:
            await m.start()
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                await asyncio.gather(*(m.getmany(timeout_ms=100) for m in members))
                if all(m.assignment() for m in members):
                    return True
            return False
        finally:
            for m in members:
                await m.stop()

    # A member stuck in its join (seen on noida-db) would hang asyncio.run: judge it from another thread.
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(asyncio.run(run())), daemon=True)
    worker.start()
    worker.join(timeout + 20)
    return bool(result and result[0])


def _concurrent_writes(settings: Settings, topic: str, producers: int = 6, each: int = 20) -> str:
    """Several producers writing one partition at once, one record a request: how many acked records remain."""
    acked: list[int] = []

    def write(tag: int) -> None:
        p, ok = producer(settings), 0
        try:
            for i in range(each):
                p.produce(topic, f"{tag}-{i}".encode(), key=b"k")
                flush_or_raise(p)
                ok += 1
        except Exception:  # noqa: BLE001 - a producer the broker fenced: its acked records still count
            pass
        acked.append(ok)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        kept = len({m.value() for m in read_to_end(settings, topic, timeout=30)})
    except TimeoutError:
        kept = 0
    return f"{kept} of {sum(acked)} acked kept ({producers * each} sent)"


def _killed_right_after_ack(cand: Candidate, settings: Settings, topic: str, n: int = 2000) -> str:
    p = producer(settings)
    for i in range(n):
        p.produce(topic, VALUE)
    flush_or_raise(p)
    cand.kill()
    cand.start()
    try:
        return f"{sum(1 for _ in read_to_end(settings, topic, timeout=120))} of {n} acked kept"
    except (LookupError, TimeoutError):
        return f"0 of {n} acked kept (topic gone)"


@dataclass
class Measured:
    produce_s: float = 0.0
    consume_s: float = 0.0
    n: int = 0
    latency_s: list[float] = field(default_factory=list)
    rss_idle_mb: float = 0.0
    rss_mb: float = 0.0
    survived: str = ""
    two_confluent: bool | None = None
    two_aiokafka: bool | None = None
    concurrent: str = ""
    killed: str = ""


def measure(name: str, n: int, samples: int, workdir: Path) -> Measured:
    root = workdir / name.replace("/", "-")
    root.mkdir(parents=True)
    cand = Candidate(name, root, fetch_wait_ms=10 if name in ("memory", "noida-db") else 200)
    out = Measured(n=n)
    try:
        bootstrap = cand.start()
        time.sleep(0.5)
        out.rss_idle_mb = rss_mb(cand.pids())
        settings = Settings(bootstrap_servers=bootstrap, topic_prefix=f"b{uuid.uuid4().hex[:8]}",
                            partitions=PARTITIONS, local_fetch_wait_ms=cand.fetch_wait_ms)
        create_topics(settings)
        topic = f"{settings.topic_prefix}.spans"
        out.produce_s = _produce(settings, topic, n)
        got, out.consume_s = _consume(settings, topic)
        assert got == n + 1, f"read {got} of {n + 1}"
        out.rss_mb = rss_mb(cand.pids())
        out.latency_s = _latency(settings, f"{settings.topic_prefix}.rollout-events", samples)
        out.two_confluent = _two_members_confluent(settings, f"{settings.topic_prefix}.rollout-offers")
        out.two_aiokafka = _two_members_aiokafka(bootstrap, f"{settings.topic_prefix}.triplets")
        out.concurrent = _concurrent_writes(settings, f"{settings.topic_prefix}.workers")
        offsets = _commit_half(settings, topic)
        cand.stop()
        cand.start()
        try:
            after = sum(1 for _ in read_to_end(settings, topic, timeout=600))
        except (LookupError, TimeoutError):
            after = 0
        kept = _committed(settings, topic) == offsets if after else False
        out.survived = f"{after}/{n + 1} records, offsets {'kept' if kept else 'lost'}"
        out.killed = _killed_right_after_ack(cand, settings, f"{settings.topic_prefix}.resources")
    finally:
        cand.stop()
    return out


def _rows(name: str, m: Measured) -> list[Row]:
    lat = sorted(m.latency_s)
    p50 = statistics.median(lat) * 1000 if lat else float("nan")
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan")
    groups = f"2 members: confluent {'ok' if m.two_confluent else 'NO'}, aiokafka {'ok' if m.two_aiokafka else 'NO'}"
    return [
        Row(f"{name}: produce", m.n / m.produce_s, m.n * len(VALUE) / m.produce_s / 1e6, m.n, "", [m.produce_s]),
        Row(f"{name}: consume", m.n / m.consume_s, m.n * len(VALUE) / m.consume_s / 1e6, m.n,
            f"RSS idle {m.rss_idle_mb:.0f} MB, after the log {m.rss_mb:.0f} MB", [m.consume_s]),
        Row(f"{name}: fetch latency", None, None, len(lat), f"p50 {p50:.0f} ms, p99 {p99:.0f} ms"),
        Row(f"{name}: restart", None, None, None, m.survived),
        Row(f"{name}: SIGKILL at once after the ack", None, None, None, m.killed),
        Row(f"{name}: 6 producers, 1 partition", None, None, None, m.concurrent),
        Row(f"{name}: consumer group", None, None, None, groups),
    ]


CANDIDATES = ("memory", "s3/moto", "s3/s3rver", "s3/local-s3-server", "noida-db")


def run(ctx: Context) -> Report:
    n, samples = (3_000, 20) if ctx.quick else (20_000, 50)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="litstream-storage-") as tmp:
        for name in CANDIDATES:
            ctx.step(f"{name}: {n} records")
            try:
                rows += _rows(name, measure(name, n, samples, Path(tmp)))
            except Exception as exc:  # a candidate that cannot run here is a finding, not a failure
                rows.append(Row(f"{name}", None, None, None, f"did not run: {type(exc).__name__}: {exc}"[:140]))
    return Report(rows, {"records": n, "value_bytes": len(VALUE), "partitions": PARTITIONS,
                         "latency_samples": samples})
