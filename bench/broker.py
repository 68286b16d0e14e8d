"""broker: what the embedded broker (Apache Kafka in KRaft mode, one JVM) costs the machine it runs on.

Each repeat takes a fresh log dir: the format (``kafka.tools.StorageTool``, a JVM of its own), the start from
Popen until the broker answers a metadata request, its RSS then; the catalogue's topics (4 partitions). The
first repeat then leaves it idle for ``idle_s`` (CPU-seconds and RSS after), and produces and consumes
kafka_codec's pre-encoded ``SpanRecorded`` values through it (the broker's CPU-seconds for each). Then a clean
stop (SIGTERM) and a start on the same log dir, a SIGKILL and a start again (log recovery), each checked to
hold every record. The broker's CPU-seconds over the whole benchmark come from the rusage of this process's
waited-for children: every broker and format JVM, shutdowns included.
"""

from __future__ import annotations

import resource
import secrets
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from rich.table import Table

from litstream.infra.broker import DEFAULT_HEAP_MB, KAFKA_VERSION, KafkaBroker
from litstream.infra.kafka import create_topics, end_offsets
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec
from litstream.schemas.events import EventFactory

from .harness import Context, Report, Row, rate_row
from .kafka_codec import build_spans, consume_all, produce_raw, span_variants
from .processes import cpu_seconds, rss_bytes

TITLE = f"the embedded broker (Apache Kafka {KAFKA_VERSION}): start, restart, RSS, CPU, produce/consume"
PARTITIONS = 4
KAFKA = f"Apache Kafka {KAFKA_VERSION}"


@dataclass(frozen=True)
class Sizes:
    repeats: int  # fresh log dirs, each started, stopped, started, killed and started again
    idle_s: float
    spans: int  # SpanRecorded values produced and consumed, `copies` times over
    copies: int


FULL = Sizes(repeats=3, idle_s=30.0, spans=20_000, copies=3)
QUICK = Sizes(repeats=1, idle_s=5.0, spans=500, copies=1)


@dataclass
class Costs:
    format_s: list[float] = field(default_factory=list)
    start_s: dict[str, list[float]] = field(default_factory=dict)  # "fresh", "restarted", "killed"
    led_s: dict[str, list[float]] = field(default_factory=dict)  # from Popen until the spans topic serves
    stop_s: list[float] = field(default_factory=list)  # SIGTERM until the process exited
    rss_mb: dict[str, float] = field(default_factory=dict)  # "started", "idle", "loaded"
    idle_cpu_s: float = 0.0
    produce_s: float = 0.0
    consume_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)  # "produce", "consume"
    records: int = 0
    nbytes: int = 0
    kept: dict[str, int] = field(default_factory=dict)  # records on the topic after each restart
    total_cpu_s: float = 0.0
    wall_s: float = 0.0


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _pid(broker: KafkaBroker) -> int:
    assert broker.proc is not None
    return broker.proc.pid


def _rss_mb(broker: KafkaBroker) -> float:
    return (rss_bytes(_pid(broker)) or 0) / 2**20


def _cpu(broker: KafkaBroker) -> float:
    return cpu_seconds(_pid(broker)) or 0.0


def _kept(settings: Settings, timeout: float = 120.0) -> int:
    """Records on the spans topic (the sum of its high-water marks), once every partition answers ListOffsets:
    a restarted broker answers metadata before it leads its partitions again."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            ends = end_offsets(settings, Topics(settings.topic_prefix).spans, list(range(PARTITIONS)))
            return sum(ends.values())
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _start(broker: KafkaBroker, settings: Settings, kind: str, costs: Costs) -> int:
    """Start on a formatted log dir: Popen until it answers, then until the topic's partitions serve; the
    records the topic holds."""
    start = time.perf_counter()
    broker.start()
    costs.start_s.setdefault(kind, []).append(time.perf_counter() - start)
    kept = _kept(settings)
    costs.led_s.setdefault(kind, []).append(time.perf_counter() - start)
    return kept


def _load(ctx: Context, sizes: Sizes, broker: KafkaBroker, settings: Settings, costs: Costs) -> None:
    """Idle, then produce and consume through it: CPU-seconds and RSS of each."""
    ctx.step(f"idle for {sizes.idle_s:.0f} s (the catalogue's topics, no client)")
    costs.rss_mb["started"] = _rss_mb(broker)
    before = _cpu(broker)
    time.sleep(sizes.idle_s)
    costs.idle_cpu_s = _cpu(broker) - before
    costs.rss_mb["idle"] = _rss_mb(broker)
    spans = build_spans(sizes.spans, span_variants(), EventFactory(role="bench"))
    codec = Codec()
    keys = [s.key.encode() for s in spans] * sizes.copies
    values = [codec.encode(s) for s in spans] * sizes.copies
    costs.records, costs.nbytes = len(values), sum(map(len, values))
    topic = Topics(settings.topic_prefix).spans
    ctx.step(f"produce and consume {costs.records:,} records")
    before = _cpu(broker)
    costs.produce_s = produce_raw(settings, topic, keys, values)
    middle = _cpu(broker)
    costs.consume_s, _, consumed = consume_all(settings, topic, len(values))
    costs.cpu_s = {"produce": middle - before, "consume": _cpu(broker) - middle}
    costs.rss_mb["loaded"] = _rss_mb(broker)
    if consumed != costs.nbytes:
        raise RuntimeError(f"read {consumed} value bytes back, produced {costs.nbytes}")


def _cycle(ctx: Context, sizes: Sizes, root: Path, r: int, costs: Costs) -> None:
    """One fresh log dir: format, start, (load), stop, start, kill, start."""
    broker = KafkaBroker(root / f"kafka-{r}", log_path=root / f"broker-{r}.log")
    settings = Settings(bootstrap_servers="", topic_prefix=f"bench-broker-{secrets.token_hex(3)}",
                        partitions=PARTITIONS)
    try:
        ctx.step(f"repeat {r + 1}/{sizes.repeats}: format and start on a fresh log dir")
        start = time.perf_counter()
        broker.format()
        costs.format_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        broker.start()
        costs.start_s.setdefault("fresh", []).append(time.perf_counter() - start)
        settings = settings.model_copy(update={"bootstrap_servers": broker.bootstrap})
        create_topics(settings)
        costs.led_s.setdefault("fresh", []).append(time.perf_counter() - start)
        if r == 0:
            _load(ctx, sizes, broker, settings, costs)
        ctx.step("stop (SIGTERM), start again on the same log dir; SIGKILL, start again")
        start = time.perf_counter()
        broker.stop()
        costs.stop_s.append(time.perf_counter() - start)
        kept = _start(broker, settings, "restarted", costs)
        if r == 0:
            costs.kept["restarted"] = kept
        broker.kill()
        kept = _start(broker, settings, "killed", costs)
        if r == 0:
            costs.kept["killed"] = kept
    finally:
        broker.stop()


def _spread(samples: list[float]) -> str:
    if len(samples) == 1:
        return f"{samples[0]:.1f} s"
    median = statistics.median(samples)
    return f"median {median:.1f} s ({min(samples):.1f}-{max(samples):.1f}, {len(samples)} runs)"


def _start_rows(costs: Costs) -> list[Row]:
    med = statistics.median
    led = {kind: med(s) - med(costs.start_s[kind]) for kind, s in costs.led_s.items()}
    return [
        Row(f"{KAFKA} start, fresh log dir (Popen -> answering)", samples_s=costs.start_s["fresh"],
            note=f"{_spread(costs.start_s['fresh'])}; before it the format (StorageTool, a JVM of its own) "
                 f"{_spread(costs.format_s)}; the catalogue's topics created +{led['fresh']:.1f} s"),
        Row(f"{KAFKA} start, restarted log dir (after a clean stop)", samples_s=costs.start_s["restarted"],
            note=f"{_spread(costs.start_s['restarted'])}; spans topic serving +{led['restarted']:.1f} s; "
                 f"{costs.kept.get('restarted', 0):,} of {costs.records:,} records kept; the stop (SIGTERM, "
                 f"controlled shutdown) {_spread(costs.stop_s)}"),
        Row(f"{KAFKA} start after SIGKILL (log recovery)", samples_s=costs.start_s["killed"],
            note=f"{_spread(costs.start_s['killed'])}; spans topic serving +{led['killed']:.1f} s; "
                 f"{costs.kept.get('killed', 0):,} of {costs.records:,} records kept"),
    ]


def _rows(sizes: Sizes, costs: Costs) -> list[Row]:
    n, rss = costs.records, costs.rss_mb
    starts = sum(map(len, costs.start_s.values()))
    where = f"{KAFKA}, {PARTITIONS} partitions"
    return [
        *_start_rows(costs),
        Row(f"{KAFKA} RSS", note=f"{rss['started']:,.0f} MiB once answering, {rss['idle']:,.0f} after "
                                 f"{sizes.idle_s:.0f} s idle, {rss['loaded']:,.0f} after producing and "
                                 f"consuming {n:,} records; heap {DEFAULT_HEAP_MB} MiB (fixed: -Xms = -Xmx)"),
        Row(f"{KAFKA} CPU, {sizes.idle_s:.0f} s idle", note=f"{costs.idle_cpu_s:.2f} CPU-s "
            f"({costs.idle_cpu_s / sizes.idle_s:.1%} of a core); the catalogue's topics, no client"),
        rate_row(f"{where}: produce", [costs.produce_s], n, costs.nbytes,
                 f"pre-encoded SpanRecorded, incl. flush, {sizes.idle_s:.0f} s after the start; broker "
                 f"{costs.cpu_s['produce']:.2f} CPU-s, "
                 f"{1e6 * costs.cpu_s['produce'] / n:,.0f} us per record"),
        rate_row(f"{where}: consume", [costs.consume_s], n, costs.nbytes,
                 f"assign from 0, to the last record; broker {costs.cpu_s['consume']:.2f} CPU-s, "
                 f"{1e6 * costs.cpu_s['consume'] / n:,.0f} us per record"),
        Row(f"{KAFKA} CPU over this benchmark", note=f"{costs.total_cpu_s:,.1f} CPU-s in "
            f"{costs.wall_s:,.0f} s: every broker and format JVM it ran ({starts} starts, "
            f"{len(costs.format_s)} format{'s' if len(costs.format_s) > 1 else ''})"),
    ]


def print_costs(ctx: Context, sizes: Sizes, costs: Costs) -> None:
    table = Table(title=f"broker: {KAFKA}'s own cost", title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    med = statistics.median
    for figure, value in (
        ("start, fresh log dir (s)", f"{med(costs.start_s['fresh']):.1f}"),
        ("start, restarted log dir (s)", f"{med(costs.start_s['restarted']):.1f}"),
        ("start after SIGKILL (s)", f"{med(costs.start_s['killed']):.1f}"),
        ("format, fresh log dir (s)", f"{med(costs.format_s):.1f}"),
        ("RSS idle (MiB)", f"{costs.rss_mb['idle']:,.0f}"),
        ("RSS after produce + consume (MiB)", f"{costs.rss_mb['loaded']:,.0f}"),
        (f"CPU over {sizes.idle_s:.0f} s idle (CPU-s)", f"{costs.idle_cpu_s:.2f}"),
        ("CPU over the benchmark (CPU-s)", f"{costs.total_cpu_s:,.1f}"),
    ):
        table.add_row(figure, value)
    ctx.console.print(table)


def run(ctx: Context) -> Report:
    sizes = QUICK if ctx.quick else FULL
    costs = Costs()
    cpu_before, start = _children_cpu_s(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="litstream-bench-broker-", ignore_cleanup_errors=True) as tmp:
        for r in range(sizes.repeats):
            _cycle(ctx, sizes, Path(tmp), r, costs)
    costs.total_cpu_s, costs.wall_s = _children_cpu_s() - cpu_before, time.perf_counter() - start
    for kind, kept in costs.kept.items():
        if kept != costs.records:
            raise RuntimeError(f"the broker kept {kept} of {costs.records} records after its start ({kind})")
    print_costs(ctx, sizes, costs)
    params: dict[str, Any] = {**asdict(sizes), "partitions": PARTITIONS, "heap_mb": DEFAULT_HEAP_MB,
                              "costs": asdict(costs)}
    return Report(_rows(sizes, costs), params)
