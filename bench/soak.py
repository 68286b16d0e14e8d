"""soak: many rollouts and spans through the whole embedded stack, with every process's memory sampled,
consumer lag driven back to zero and nothing lost.

The stack: the embedded broker (Apache Kafka, its log durable on disk under the soak's scratch directory, as
``litstream up`` keeps it), the lifecycle processor, the span sink (chDB), the triplet processor and several
runner processes, each a process of its own (``app.stack.Stack``, as ``litstream up`` runs them). The runners
run ``soak_agent`` below: a cheap agent that writes ``spans`` spans per rollout (a root, one LLM call with
token ids, tool steps, the reward), so the triplet processor has one triplet to make per rollout. This process
enqueues the rollouts with at most ``in_flight`` unfinished at a time, follows ``rollout-state`` to see them
finish, and every ``sample_s`` seconds samples the RSS and CPU of every process and the lag of every consumer
group: per partition the high-water mark (ListOffsets) minus the committed offset (OffsetFetch).

At the end it waits until every group's lag is zero, then checks that nothing was lost: every rollout
succeeded, ``count() FROM spans FINAL`` equals the records on the spans topic and rollouts x spans,
``rollout_events`` holds one ``RolloutEnqueued`` per rollout, one triplet per rollout, and no dead letter
anywhere. It reports the rate over each tenth and quarter of the rollouts (flat: the last quarter within 20%
of the first), every process's peak RSS against its bound (the broker: its heap plus the JVM's own; a Python
process: 500 MiB), and plots the rate, the RSS and the lag over the run.

``python -m bench.soak`` runs a smoke size (1,000 rollouts); the full soak is
``python -m bench.soak --rollouts 100000 --spans 1000000`` (see bench/README.md).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import OffsetSpec
from rich.console import Console
from rich.table import Table

from litstream.app.stack import Stack
from litstream.infra import clickhouse
from litstream.infra.kafka import admin, consumer, headers_dict, read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import DecodeError
from litstream.schemas.events import RolloutSnapshot
from litstream.schemas.models import FINISHED
from litstream.workers.client import enqueue_rollout
from litstream.workers.sdk import AttemptContext

from .harness import RESULTS_DIR, Context, Report, Row
from .lifecycle import PARTITIONS
from .processes import cpu_of, rss_file_of, rss_of

TITLE = "soak: rollouts and spans through the embedded stack; RSS of every process, consumer lag back to zero, loss"

AGENT = "bench.soak:soak_agent"
# SIGUSR1 ends the soak early: no more rollouts are enqueued, the ones enqueued finish, and the checks run on them.
STOP_EARLY = threading.Event()


@dataclass(frozen=True)
class Sizes:
    rollouts: int
    spans: int  # per rollout: root + 1 LLM call + (spans - 3) tool steps + reward
    runners: int = 4  # runner processes (at most `partitions` of them get offers)
    partitions: int = PARTITIONS
    concurrency: int = 32  # agent slots per runner: each mostly waits on a round trip through the broker
    in_flight: int = 2_000  # enqueued and not yet finished, at most
    sample_s: float = 5.0
    stall_s: float = 300.0  # no rollout finished for this long: fail with the diagnostics
    settle_s: float = 600.0  # after the last rollout: time for the lag to reach zero and ClickHouse to hold all


# 16 partitions, not the default 4: the lifecycle processor's produce requests carry one batch per partition, so
# more partitions mean more records per request; the rates in docs/benchmarks.md were measured with 16.
FULL = Sizes(rollouts=100_000, spans=10, runners=4, concurrency=32, partitions=16)
DEFAULT = Sizes(rollouts=1_000, spans=10, runners=4, concurrency=32, partitions=16)  # a smoke run
QUICK = Sizes(rollouts=300, spans=10, runners=2, concurrency=4, partitions=4, in_flight=300, sample_s=2.0,
              stall_s=120.0, settle_s=120.0)


# --- the agent the runners run ------------------------------------------------------------------------------


def soak_agent(task: dict[str, Any], ctx: AttemptContext) -> float:
    """``task["spans"]`` spans: a root, one LLM call with token ids (a triplet), tool steps, and the reward."""
    n = max(3, int(task.get("spans", 10)))
    i = int(task.get("i", 0))
    with ctx.span("agent.rollout", {"soak.index": i}):
        prompt_ids = [1 + (i + k) % 250 for k in range(16)]
        with ctx.span("chat soak-policy", {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "soak-policy",
            "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": f"soak task {i}: say ok",
            "prompt_token_ids": prompt_ids,
        }) as llm:
            llm.set_attributes({"gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "ok",
                                "gen_ai.usage.input_tokens": len(prompt_ids), "gen_ai.usage.output_tokens": 2,
                                "response_token_ids": [111, 107]})
        for step in range(n - 3):
            with ctx.span("tool.step", {"tool.name": "noop", "tool.step": step, "tool.output": "x" * 64}):
                pass
    return 1.0  # the runner emits it as the reward span


# --- measuring ----------------------------------------------------------------------------------------------


class Ends:
    """The end of every partition of some topics (its high-water mark: the next offset to be written), all in
    one ListOffsets round; ``read()`` refreshes them. A client per read: none outlives the broker."""

    def __init__(self, settings: Settings, topics: Iterable[str]) -> None:
        self._settings = settings
        meta = admin(settings).list_topics(timeout=10.0).topics
        self.parts = [TopicPartition(t, p) for t in topics for p in sorted(meta[t].partitions)]
        self.ends: dict[tuple[str, int], int] = {(tp.topic, tp.partition): 0 for tp in self.parts}

    def read(self, timeout: float = 30.0) -> dict[tuple[str, int], int]:
        client = admin(self._settings)  # held until the answers are in: its futures end with it
        asked = client.list_offsets({tp: OffsetSpec.latest() for tp in self.parts}, request_timeout=timeout)
        self.ends = {(tp.topic, tp.partition): int(f.result().offset) for tp, f in asked.items()}
        return dict(self.ends)

    def total(self, topic: str) -> int:
        return sum(end for (t, _), end in self.ends.items() if t == topic)


class GroupLag:
    """Committed offsets of one consumer group (OffsetFetch, without joining the group)."""

    def __init__(self, settings: Settings, group: str, topics: list[str], ends: Ends) -> None:
        self.group = group
        self.parts = [TopicPartition(tp.topic, tp.partition) for tp in ends.parts if tp.topic in topics]
        self._consumer: Consumer = consumer(settings, group_id=group)

    def lag(self, ends: dict[tuple[str, int], int]) -> dict[str, int]:
        """Per topic: sum over partitions of end - committed (a partition with no commit lags by its end)."""
        out: dict[str, int] = {}
        for tp in self._consumer.committed(self.parts, timeout=30.0):
            committed = tp.offset if tp.offset >= 0 else 0
            out[tp.topic] = out.get(tp.topic, 0) + max(0, ends[(tp.topic, tp.partition)] - committed)
        return out

    def close(self) -> None:
        self._consumer.close()


class Finished:
    """Follows ``rollout-state`` from the beginning: which of our rollouts have finished, and how."""

    def __init__(self, settings: Settings, events: EventProducer) -> None:
        self.codec = events.codec
        topic = events.topics.state
        meta = admin(settings).list_topics(topic=topic, timeout=10.0).topics[topic]
        self._consumer = consumer(settings, group_id=f"soak-state-{os.getpid()}-{time.monotonic_ns()}",
                                  **{"queued.max.messages.kbytes": 8192})
        self._consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        self.pending: set[str] = set()
        self.by_status: dict[str, int] = {}
        self.finished = 0
        self.undecodable = 0
        self.snapshots = 0

    def poll(self, timeout: float) -> int:
        got = 0
        for msg in self._consumer.consume(num_messages=5_000, timeout=timeout):
            if msg.error() is not None:
                continue
            self.snapshots += 1
            try:
                snap = self.codec.decode_as(msg.value(), RolloutSnapshot)
            except DecodeError:
                self.undecodable += 1
                continue
            if snap.status in FINISHED and snap.rollout_id in self.pending:
                self.pending.discard(snap.rollout_id)
                self.by_status[snap.status] = self.by_status.get(snap.status, 0) + 1
                self.finished += 1
                got += 1
        return got

    def close(self) -> None:
        self._consumer.close()


@dataclass
class Sample:
    t: float  # seconds since the first enqueue
    enqueued: int
    finished: int
    spans_stored: int  # rows in the spans table (without FINAL: a cheap progress figure)
    rss_mb: dict[str, float]
    lag: dict[str, int]  # group -> records behind, all its topics
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds used so far, per process
    file_mb: dict[str, float] = field(default_factory=dict)  # the file-backed part of rss_mb (mapped libraries)


@dataclass
class SoakResult:
    sizes: Sizes
    samples: list[Sample] = field(default_factory=list)
    phases_s: dict[str, float] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    final_lag: dict[str, dict[str, int]] = field(default_factory=dict)
    settle_lag_s: float = 0.0
    plot: str | None = None
    rollouts: int = 0  # driven through: sizes.rollouts, or fewer if stopped early (SIGUSR1)
    heap_mb: int = 0  # the broker's JVM heap
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)


def _groups(topics: Topics, prefix: str) -> dict[str, list[str]]:
    """Every consumer group of the pipeline and the topics it commits."""
    return {
        "lifecycle": [topics.rollout_events],  # Faust's group is its app id
        "span-sink": [topics.spans, topics.rollout_events, topics.triplets],
        "triplets": [topics.spans, topics.state],
        "runners": [topics.offers],
    }


def _group_ids(topics: Topics, prefix: str) -> dict[str, str]:
    return {"lifecycle": topics.faust_app_id, "span-sink": f"{prefix}-span-sink", "triplets": f"{prefix}-triplets",
            "runners": f"{prefix}-runners"}


def _dlq_topics(settings: Settings, topics: Topics) -> list[str]:
    names = admin(settings).list_topics(timeout=10.0).topics
    return sorted(t for t in names if t.startswith(f"{settings.topic_prefix}.") and t.endswith(".dlq"))


REJECTED_CLAIM = "rollout-events.dlq: claim rejected:"
IDS = re.compile(r"\b(ro|at)-[0-9a-f]+")


def _dead_letters(settings: Settings, dlq_topics: list[str]) -> tuple[dict[str, int], Counter[str]]:
    """Every dead letter, read to the end of its topic: the count per topic that has any, and the count per reason
    (first line, ids cut off), to say what went wrong without the logs."""
    per_topic: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for topic in dlq_topics:
        for msg in read_to_end(settings, topic):
            per_topic[topic] += 1
            reason = headers_dict(msg).get("litstream.dlq.reason", b"?").decode(errors="replace").splitlines()[0]
            short = IDS.sub(lambda m: m.group(1) + "-*", reason)[:120]
            reasons[f"{topic.removeprefix(settings.topic_prefix + '.')}: {short}"] += 1
    return dict(per_topic), reasons


def _count(settings: Settings, sql: str) -> int:
    return int(clickhouse.query(settings.resolved_clickhouse_dsn, sql, timeout=300.0).rows[0][0])


def _check_alive(stack: Stack) -> None:
    for name, proc in stack.roles.items():
        if not proc.alive():
            raise RuntimeError(f"{name} exited with code {proc.proc.returncode}; see {proc.log_path}")


@contextmanager
def _run_dir(results_dir: Path) -> Iterator[str]:
    """A scratch directory for the stack, removed at the end; when the soak fails, the processes' logs are copied
    to ``results_dir`` first, so the failure can be read afterwards."""
    tmp = tempfile.mkdtemp(prefix="litstream-bench-soak-")
    try:
        yield tmp
    except BaseException:
        logs = Path(tmp) / "data" / "logs"
        if logs.is_dir():
            kept = results_dir / f"soak-logs-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
            shutil.copytree(logs, kept, dirs_exist_ok=True)
            print(f"the processes' logs are kept in {kept}", file=sys.stderr)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _soak_settings(sizes: Sizes, tmp: str) -> Settings:
    """The durable default, whatever the environment says (the tests run their stacks ephemeral): the broker's
    log under ``<data_dir>/kafka``, on disk, as `litstream up` keeps it."""
    return Settings(partitions=sizes.partitions, data_dir=Path(tmp) / "data", broker_storage="durable",
                    topic_prefix=f"bench-soak-{secrets.token_hex(3)}")


def _start_pipeline(ctx: Context, stack: Stack, sizes: Sizes, result: SoakResult) -> None:
    """The broker, its topics and every process of the pipeline, each answering its readiness check."""
    ctx.step(f"starting the embedded broker (log dir {stack.settings.data_dir / 'kafka'})")
    start = time.perf_counter()
    stack.start_broker()  # formats the fresh log dir, then Popen until it answers
    result.phases_s["broker_start"] = time.perf_counter() - start
    result.heap_mb = stack.settings.broker_heap_mb
    stack.create_topics()
    ctx.step(f"starting the lifecycle processor, the span sink, the triplet processor and {sizes.runners} "
             f"runners x {sizes.concurrency} slots")
    stack.start("lifecycle", "process", "lifecycle")
    stack.start("span-sink", "process", "span-sink")
    stack.start("triplets", "process", "triplets")
    for i in range(sizes.runners):
        stack.start(f"runner-{i}", "runner", "--concurrency", str(sizes.concurrency), "--agent", AGENT,
                    "--drain", "5")
    stack.wait_ready("lifecycle", "lifecycle", timeout=120)
    stack.wait_ready("span-sink", "span-sink", key="inserted", timeout=120)
    stack.wait_ready("triplets", "triplets", timeout=120)
    _check_alive(stack)


class _Probes:
    """This process's clients on the running stack: the producer that enqueues, the follower of finished rollouts,
    the partitions' ends and every group's lag, and the pids whose memory and CPU are sampled."""

    def __init__(self, stack: Stack) -> None:
        assert stack.broker is not None and stack.broker.proc is not None
        self.stack = stack
        self.settings = settings = stack.settings
        self.topics = topics = Topics(settings.topic_prefix)
        self.pids = {"broker": stack.broker.proc.pid, **{name: proc.proc.pid for name, proc in stack.roles.items()},
                     "soak (this process)": os.getpid()}
        self.events = EventProducer(settings, role="soak")
        self.finished = Finished(settings, self.events)
        groups = _groups(topics, settings.topic_prefix)
        group_ids = _group_ids(topics, settings.topic_prefix)
        self.ends = Ends(settings, sorted({t for ts in groups.values() for t in ts}))
        self.lags = {name: GroupLag(settings, group_ids[name], ts, self.ends) for name, ts in groups.items()}
        self.start = time.monotonic()
        self.enqueued = 0

    def enqueue(self, count: int, spans: int) -> None:
        for _ in range(count):
            ev = enqueue_rollout(self.events, {"i": self.enqueued, "spans": spans}, mode="train")
            self.finished.pending.add(ev.rollout_id)
            self.enqueued += 1

    def sample(self, t: float | None = None) -> Sample:
        return _sample(self.settings, time.monotonic() - self.start if t is None else t, self.enqueued, self.finished.finished,
                       self.pids, self.ends, self.lags)

    def close(self) -> None:
        for g in self.lags.values():
            g.close()
        self.finished.close()
        self.events.close()  # its producer goes before the broker does


def _progress_line(sample: Sample, n: int) -> str:
    return (f"{sample.t:6.0f}s  finished {sample.finished:,}/{n:,}  spans stored {sample.spans_stored:,}  "
            f"lag {sample.lag}  RSS MB " + " ".join(f"{k.split(' ')[0]}={v:.0f}" for k, v in sample.rss_mb.items())
            + "  CPU s " + " ".join(f"{k.split(' ')[0]}={v:.0f}" for k, v in sample.cpu_s.items()))


def _drive(ctx: Context, probes: _Probes, sizes: Sizes, result: SoakResult) -> None:
    """Enqueue the rollouts, at most ``in_flight`` unfinished at a time, until all have finished; sample as it
    goes. A stall (no rollout finished for ``stall_s``) fails the soak."""
    finished = probes.finished
    n = result.rollouts = sizes.rollouts
    ctx.step(f"driving {n:,} rollouts x {sizes.spans} spans, at most {sizes.in_flight:,} in flight")
    probes.start = last_progress = time.monotonic()
    last_sample = float("-inf")
    while finished.finished < n:
        if STOP_EARLY.is_set() and n > probes.enqueued:
            n = result.rollouts = max(probes.enqueued, 1)
            ctx.step(f"stopped early (SIGUSR1): the {n:,} rollouts enqueued so far finish, then the checks")
        room = min(n - probes.enqueued, sizes.in_flight - (probes.enqueued - finished.finished))
        probes.enqueue(max(0, min(room, 500)), sizes.spans)
        if finished.poll(0.05 if room > 0 else 0.2):
            last_progress = time.monotonic()
        now = time.monotonic()
        if now - last_sample >= sizes.sample_s:
            last_sample = now
            _check_alive(probes.stack)
            result.samples.append(sample := probes.sample(now - probes.start))
            ctx.step(_progress_line(sample, n))
        if now - last_progress > sizes.stall_s:
            raise RuntimeError(f"no rollout finished for {sizes.stall_s:.0f}s: {finished.finished:,} of "
                               f"{n:,} finished ({finished.by_status}); logs in {probes.stack.log_dir}")
    probes.events.flush()
    result.phases_s["rollouts"] = time.monotonic() - probes.start
    result.samples.append(probes.sample(result.phases_s["rollouts"]))  # the rate curve's last point


def _settle(ctx: Context, probes: _Probes, sizes: Sizes, result: SoakResult) -> None:
    """Wait until every group's lag is zero and ClickHouse holds every span, sampling as it goes."""
    ctx.step("all rollouts finished; waiting for every group's lag to reach zero")
    settle_start = time.monotonic()
    expected_spans = result.rollouts * sizes.spans
    while True:
        _check_alive(probes.stack)
        ends = probes.ends.read()
        lag = {name: g.lag(ends) for name, g in probes.lags.items()}
        stored = _count(probes.settings, "SELECT count() FROM spans")
        result.samples.append(Sample(time.monotonic() - probes.start, probes.enqueued, probes.finished.finished,
                                     stored, rss_of(probes.pids), {k: sum(v.values()) for k, v in lag.items()},
                                     cpu_of(probes.pids), rss_file_of(probes.pids)))
        if all(v == 0 for per in lag.values() for v in per.values()) and stored >= expected_spans:
            break
        if time.monotonic() - settle_start > sizes.settle_s:
            raise RuntimeError(f"lag not back to zero within {sizes.settle_s:.0f}s of the last rollout: "
                               f"{lag}; spans stored {stored:,} of {expected_spans:,}")
        time.sleep(min(sizes.sample_s, 2.0))
    result.settle_lag_s = time.monotonic() - settle_start
    result.phases_s["total"] = time.monotonic() - probes.start
    result.final_lag = lag


def _loss_checks(probes: _Probes, expected_spans: int, reasons: Counter[str], dead: dict[str, int]) -> dict[str, Any]:
    """What went in against what came out, on Kafka and in ClickHouse."""
    settings, topics, ends, finished = probes.settings, probes.topics, probes.ends, probes.finished
    return {
        "rollouts_enqueued": probes.enqueued,
        "rollouts_by_status": dict(finished.by_status),
        "snapshots_read": finished.snapshots,
        "undecodable_snapshots": finished.undecodable,
        "spans_expected": expected_spans,
        "spans_on_kafka": ends.total(topics.spans),
        "spans_in_clickhouse_final": _count(settings, "SELECT count() FROM spans FINAL"),
        "rollouts_with_reward": _count(settings, "SELECT uniqExact(rollout_id) FROM spans FINAL "
                                                 "WHERE reward IS NOT NULL"),
        "enqueued_in_clickhouse": _count(settings, "SELECT count() FROM rollout_events FINAL "
                                                   "WHERE event_type = 'RolloutEnqueued'"),
        "lifecycle_events_on_kafka": ends.total(topics.rollout_events),
        "lifecycle_events_in_clickhouse": _count(settings, "SELECT count() FROM rollout_events FINAL"),
        "triplets_on_kafka": ends.total(topics.triplets),
        "triplets_in_clickhouse": _count(settings, "SELECT count() FROM triplets FINAL"),
        "dead_letters": dead,
        # A runner claims again when no answer comes in time; the version check rejects the later claim.
        # Lost: nothing, as long as every rollout succeeded (checked apart).
        "rejected_claims": sum(v for k, v in reasons.items() if k.startswith(REJECTED_CLAIM)),
    }


def _check_loss(ctx: Context, probes: _Probes, sizes: Sizes, result: SoakResult) -> None:
    ctx.step("checking for loss")
    for _ in range(3):  # two more samples at rest: does memory come down?
        time.sleep(sizes.sample_s)
        result.samples.append(probes.sample())
    dead, reasons = _dead_letters(probes.settings, _dlq_topics(probes.settings, probes.topics))
    result.dead_letter_reasons = dict(reasons.most_common(10))
    result.checks = _loss_checks(probes, result.rollouts * sizes.spans, reasons, dead)


def soak(ctx: Context, sizes: Sizes, results_dir: Path) -> SoakResult:
    result = SoakResult(sizes)
    with _run_dir(results_dir) as tmp, Stack(_soak_settings(sizes, tmp)) as stack:
        _start_pipeline(ctx, stack, sizes, result)
        probes = _Probes(stack)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, lambda *_: STOP_EARLY.set())
        try:
            _drive(ctx, probes, sizes, result)
            _settle(ctx, probes, sizes, result)
            _check_loss(ctx, probes, sizes, result)
            check(result)  # here, so that a failed check keeps the processes' logs
        finally:
            probes.close()
    result.plot = _plot(result, results_dir)
    return result


def _sample(settings: Settings, t: float, enqueued: int, finished: int, pids: dict[str, int], ends: Ends,
            lags: dict[str, GroupLag]) -> Sample:
    now = ends.read()
    lag = {name: sum(g.lag(now).values()) for name, g in lags.items()}
    try:
        stored = _count(settings, "SELECT count() FROM spans")
    except Exception:  # noqa: BLE001 - a busy sink answers late: the figure is for progress only
        stored = -1
    return Sample(t, enqueued, finished, stored, rss_of(pids), lag, cpu_of(pids), rss_file_of(pids))


def _plot(result: SoakResult, results_dir: Path) -> str | None:
    """bench/results/soak-<UTC>.png: the rate over the run, every process's RSS against its bound, the lag."""
    if not result.samples:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rate, ax_rss, ax_lag) = plt.subplots(3, 1, figsize=(12, 12), height_ratios=(1, 1, 0.8),
                                                  layout="constrained")
    _plot_rate(ax_rate, result)
    _plot_rss(ax_rss, result)
    _plot_lag(ax_lag, result)
    ax_lag.sharex(ax_rss)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"soak-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(2)}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def interval_rates(result: SoakResult) -> tuple[list[float], list[float]]:
    """Rollouts/s over each sampling interval while rollouts ran, and the rollouts finished at the intervals'
    edges (one more edge than rates)."""
    pairs = [(a, b) for a, b in itertools.pairwise(_drive_points(result)) if b[0] > a[0]]
    if not pairs:
        return [], []
    rates = [(f1 - f0) / (t1 - t0) for (t0, f0), (t1, f1) in pairs]
    return rates, [float(pairs[0][0][1]), *(float(b[1]) for _, b in pairs)]


def _plot_rate(ax: Any, result: SoakResult) -> None:
    """Rollouts/s per sampling interval and per tenth of the rollouts, against the rollouts finished; the band
    is the first quarter's rate +-20%."""
    n = result.rollouts or result.sizes.rollouts
    rates, edges = interval_rates(result)
    if rates:
        ax.stairs(rates, edges, baseline=None, color="0.55", linewidth=0.8,
                  label=f"per sampling interval ({result.sizes.sample_s:g} s)")
    tenths, flat = part_rates(result, 10), flatness(result)
    if tenths:
        ax.stairs(tenths, [k * n / 10 for k in range(11)], baseline=None, color="tab:blue", linewidth=2.5,
                  label="per tenth of the rollouts")
    if flat["flat"] is not None:
        first = flat["quarters"][0]
        ax.axhspan(first * 0.8, first * 1.2, color="tab:green", alpha=0.12,
                   label="first quarter's rate +-20%")
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, n)
    ax.xaxis.set_major_formatter("{x:,.0f}")
    ax.set_xlabel("rollouts finished")
    ax.set_ylabel("rollouts/s")
    ax.set_title(f"soak: {n:,} rollouts x {result.sizes.spans} spans; rollouts/s per quarter "
                 f"{_rates(flat['quarters'])} (last {flat['change']:+.0%} against the first)")
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)


def _plot_rss(ax: Any, result: SoakResult) -> None:
    ts = [s.t for s in result.samples]
    names = sorted({k for s in result.samples for k in s.rss_mb}, key=lambda k: (k != "broker", k))
    colours = _colours(len(names))
    for name, colour in zip(names, colours, strict=True):
        ax.plot(ts, [s.rss_mb.get(name, float("nan")) for s in result.samples], label=name, color=colour,
                linewidth=2.2 if name == "broker" else 1.2)
    bound = broker_bound_mb(result)
    ax.axhline(bound, color=colours[0], linestyle="--", linewidth=1)
    ax.annotate(f"broker bound: heap {result.heap_mb} + JVM {JVM_OVERHEAD_MB} MiB", (0, bound), fontsize=8,
                xycoords=("axes fraction", "data"), xytext=(4, 3), textcoords="offset points")
    ax.axhline(PYTHON_RSS_BOUND_MB, color="black", linestyle=":", linewidth=1)
    ax.annotate(f"Python process bound: {PYTHON_RSS_BOUND_MB} MiB", (0, PYTHON_RSS_BOUND_MB), fontsize=8,
                xycoords=("axes fraction", "data"), xytext=(4, 3), textcoords="offset points")
    ax.set_ylim(0, max(bound, max((v for s in result.samples for v in s.rss_mb.values()), default=0)) * 1.12)
    ax.set_ylabel("RSS (MiB)")
    ax.set_xlabel("seconds since the first enqueue")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)


def _colours(n: int) -> list[Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _plot_lag(ax: Any, result: SoakResult) -> None:
    ts = [s.t for s in result.samples]
    for group in sorted({k for s in result.samples for k in s.lag}):
        ax.plot(ts, [max(s.lag.get(group, 0), 0) + 1 for s in result.samples], label=f"lag {group}",
                linewidth=1)
    ax.set_yscale("log")
    ax.set_ylabel("consumer lag + 1 (records)")
    ax.set_xlabel("seconds since the first enqueue")
    ax.grid(alpha=0.3)
    done = ax.twinx()
    done.plot(ts, [s.finished for s in result.samples], color="black", linestyle="--",
              label="rollouts finished")
    done.set_ylabel("rollouts finished")
    done.yaxis.set_major_formatter("{x:,.0f}")
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = done.get_legend_handles_labels()
    ax.legend(lines + more, labels + more_labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.08, 1.0))


# --- the report ---------------------------------------------------------------------------------------------

# The bounds the soak judges memory by. A Python process: 500 MiB. The broker: its heap (fixed) plus what
# the JVM holds besides: direct buffers (capped at 128 MiB, infra/broker.py JVM_FLAGS), metaspace and compiled
# code (~100-150 MiB for Kafka), thread stacks and the mapped index files of its segments.
PYTHON_RSS_BOUND_MB = 500
JVM_OVERHEAD_MB = 320


def broker_bound_mb(result: SoakResult) -> float:
    return float(result.heap_mb + JVM_OVERHEAD_MB)


def _drive_points(result: SoakResult) -> list[tuple[float, int]]:
    """(seconds, rollouts finished) of every sample until the last rollout finished."""
    end = result.phases_s.get("rollouts", math.inf)
    return [(s.t, s.finished) for s in result.samples if s.t <= end + 1e-6]


def _time_at(points: list[tuple[float, int]], done: float) -> float:
    """When ``done`` rollouts had finished, interpolated between the samples on either side."""
    for (t0, f0), (t1, f1) in itertools.pairwise(points):
        if f0 >= done:
            return t0
        if f1 >= done:
            return t0 + (t1 - t0) * (done - f0) / (f1 - f0)
    return points[-1][0] if points else math.nan


def part_rates(result: SoakResult, parts: int) -> list[float]:
    """Rollouts/s over each 1/``parts`` of the rollouts, in order (NaN where the samples cannot tell)."""
    n = result.rollouts or result.sizes.rollouts
    points = _drive_points(result)
    if len(points) < 2 or points[-1][1] < n:
        return []
    times = [_time_at(points, k * n / parts) for k in range(parts + 1)]
    return [n / parts / (b - a) if b > a else math.nan for a, b in itertools.pairwise(times)]


def flatness(result: SoakResult) -> dict[str, Any]:
    """The last quarter's rate against the first: flat within +-20%."""
    quarters = part_rates(result, 4)
    if not quarters or not all(q == q for q in quarters):
        return {"quarters": quarters, "change": math.nan, "flat": None}
    change = quarters[-1] / quarters[0] - 1
    return {"quarters": quarters, "change": change, "flat": abs(change) <= 0.20}


def memory_bounds(result: SoakResult) -> dict[str, Any]:
    """Peak RSS of the broker against heap + JVM overhead, and of every Python process against 500 MiB."""
    peaks = {m["process"]: m["peak_mb"] for m in memory_table(result)}
    broker = peaks.pop("broker", 0.0)
    python_max = max(peaks.values(), default=0.0)
    worst = max(peaks, key=peaks.__getitem__, default="-")
    return {"broker_peak_mb": broker, "broker_bound_mb": broker_bound_mb(result),
            "broker_within": broker <= broker_bound_mb(result), "python_peak_mb": python_max,
            "python_peak_process": worst, "python_bound_mb": PYTHON_RSS_BOUND_MB,
            "python_within": python_max <= PYTHON_RSS_BOUND_MB,
            "python_over": sorted(k for k, v in peaks.items() if v > PYTHON_RSS_BOUND_MB)}



def memory_table(result: SoakResult) -> list[dict[str, Any]]:
    """Per process: RSS at the first sample, at a quarter of the rollouts, peak, at the end, and the growth per
    1,000 rollouts between a quarter and the end (near 0: bounded; positive: grows with what it has seen)."""
    samples = [s for s in result.samples if s.rss_mb]
    if not samples:
        return []
    n = result.rollouts or result.sizes.rollouts
    quarter = next((s for s in samples if s.finished >= n // 4), samples[0])
    last = samples[-1]
    rows = []
    for name in sorted({k for s in samples for k in s.rss_mb}, key=lambda k: (not k.startswith("broker"), k)):
        series = [s.rss_mb[name] for s in samples if name in s.rss_mb]
        at_peak = max((s for s in samples if name in s.rss_mb), key=lambda s: s.rss_mb[name])
        grown = last.finished - quarter.finished
        slope = ((last.rss_mb.get(name, 0.0) - quarter.rss_mb.get(name, 0.0)) / grown * 1000) if grown > 0 else 0.0
        cpu = last.cpu_s.get(name, 0.0) - samples[0].cpu_s.get(name, 0.0)
        rows.append({"process": name, "first_mb": series[0], "quarter_mb": quarter.rss_mb.get(name, series[0]),
                     "peak_mb": max(series), "peak_file_mb": at_peak.file_mb.get(name, 0.0),
                     "final_mb": series[-1], "mb_per_1k_rollouts": slope,
                     "cpu_s": cpu, "cpu_share": cpu / (last.t - samples[0].t) if last.t > samples[0].t else 0.0})
    return rows


def lost_counts(result: SoakResult) -> dict[str, int]:
    """What went in and did not come out, per check (all 0: nothing lost)."""
    c = result.checks
    n = result.rollouts or result.sizes.rollouts
    return {
        "rollouts not succeeded": n - int(c.get("rollouts_by_status", {}).get("succeeded", 0)),
        "spans missing in ClickHouse": c.get("spans_on_kafka", 0) - c.get("spans_in_clickhouse_final", 0),
        "spans not produced": n * result.sizes.spans - c.get("spans_on_kafka", 0),
        "enqueued missing in ClickHouse": n - c.get("enqueued_in_clickhouse", 0),
        "lifecycle events missing in ClickHouse":
            c.get("lifecycle_events_on_kafka", 0) - c.get("lifecycle_events_in_clickhouse", 0),
        "triplets missing": n - c.get("triplets_on_kafka", 0),
        "triplets missing in ClickHouse": c.get("triplets_on_kafka", 0) - c.get("triplets_in_clickhouse", 0),
        "dead letters": sum(c.get("dead_letters", {}).values()) - c.get("rejected_claims", 0),
    }


def _rates(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values) or "-"


def _verdict(ok: bool | None) -> str:
    return {True: "met", False: "NOT met", None: "not judged"}[ok]


def _throughput_rows(result: SoakResult) -> list[Row]:
    sz, c = result.sizes, result.checks
    n = result.rollouts or sz.rollouts
    roll_s, total_s = result.phases_s.get("rollouts", 0.0), result.phases_s.get("total", 0.0)
    flat = flatness(result)
    return [
        Row("rollouts: enqueue -> claimed -> agent -> succeeded (all finished)", n / roll_s if roll_s else None,
            None, n, note=f"{roll_s:,.0f} s; {sz.runners} runners x {sz.concurrency} slots, at most "
                          f"{sz.in_flight:,} in flight; by status {c.get('rollouts_by_status')}"),
        Row("rollouts/s per tenth of the rollouts", note=_rates(part_rates(result, 10))),
        Row("rollouts/s per quarter: flat within +-20%", note=f"{_rates(flat['quarters'])}; last quarter "
            f"{flat['change']:+.0%} against the first: {_verdict(flat['flat'])}"),
        Row("spans: agent -> Kafka -> ClickHouse (FINAL), until lag 0",
            n * sz.spans / total_s if total_s else None, None, n * sz.spans,
            note=f"{total_s:,.0f} s from the first enqueue until every group's lag was 0 and ClickHouse held "
                 f"them all ({result.settle_lag_s:,.0f} s after the last rollout finished)"),
    ]


def _state_rows(result: SoakResult, lost: dict[str, int]) -> list[Row]:
    c = result.checks
    peak_lag = {g: max((s.lag.get(g, 0) for s in result.samples), default=0)
                for g in sorted({k for s in result.samples for k in s.lag})}
    loss = "nothing lost" if not any(lost.values()) else \
        "LOST: " + ", ".join(f"{k} {v:,}" for k, v in lost.items() if v)
    return [
        Row("consumer lag at the end (every group, every partition)", note=", ".join(
            f"{g} {sum(per.values())}" for g, per in result.final_lag.items()) + "; peak during the run: "
            + ", ".join(f"{g} {v:,}" for g, v in peak_lag.items())),
        Row("loss check", note=f"{loss} (spans FINAL {c.get('spans_in_clickhouse_final', 0):,} = on Kafka "
                               f"{c.get('spans_on_kafka', 0):,}; enqueued "
                               f"{c.get('enqueued_in_clickhouse', 0):,}; triplets "
                               f"{c.get('triplets_in_clickhouse', 0):,}; dead letters "
                               f"{c.get('dead_letters')}, of them later claims rejected "
                               f"{c.get('rejected_claims', 0):,})"),
    ]


def _memory_rows(result: SoakResult) -> list[Row]:
    bounds = memory_bounds(result)
    over = f" (over: {', '.join(bounds['python_over'])})" if bounds["python_over"] else ""
    rows = [
        Row("broker start (Popen -> answering; formats the fresh log dir first)",
            note=f"{result.phases_s.get('broker_start', 0.0):.1f} s; log durable on disk, heap "
                 f"{result.heap_mb} MiB"),
        Row("memory bounds (peak RSS)", note=f"broker {bounds['broker_peak_mb']:,.0f} MiB against heap + JVM "
            f"{bounds['broker_bound_mb']:,.0f}: {_verdict(bounds['broker_within'])}; largest Python process "
            f"{bounds['python_peak_process']} {bounds['python_peak_mb']:,.0f} MiB against "
            f"{PYTHON_RSS_BOUND_MB}: {_verdict(bounds['python_within'])}{over}"),
    ]
    for m in memory_table(result):
        rows.append(Row(f"RSS {m['process']}", note=f"first {m['first_mb']:,.0f} MiB, peak {m['peak_mb']:,.0f} "
                                                    f"({m['peak_file_mb']:,.0f} of it mapped files), "
                                                    f"final {m['final_mb']:,.0f}; "
                                                    f"{m['mb_per_1k_rollouts']:+.2f} MiB per 1k rollouts after 25%; "
                                                    f"CPU {m['cpu_s']:,.0f} s ({m['cpu_share']:.2f} cores)"))
    return rows


def to_report(result: SoakResult) -> Report:
    sz = result.sizes
    n = result.rollouts or sz.rollouts
    lost = lost_counts(result)
    rows = _throughput_rows(result) + _state_rows(result, lost) + _memory_rows(result)
    params = {"sizes": asdict(sz), "rollouts": n, "stopped_early": n < sz.rollouts,
              "phases_s": result.phases_s, "checks": result.checks, "lost": lost,
              "final_lag": result.final_lag,
              "settle_lag_s": result.settle_lag_s, "memory": memory_table(result),
              "bounds": memory_bounds(result), "rates_per_tenth": part_rates(result, 10),
              "flatness": flatness(result), "heap_mb": result.heap_mb, "broker_storage": "durable",
              "plot": result.plot, "samples": [asdict(s) for s in result.samples],
              "rss_source": "psutil" if _has_psutil() else "/proc/<pid>/status VmRSS"}
    return Report(rows, params)


def _has_psutil() -> bool:
    try:
        import psutil  # noqa: F401
    except ImportError:
        return False
    return True


def print_memory(console: Console, result: SoakResult) -> None:
    table = Table(title="soak: RSS per process (MiB)", title_justify="left")
    for col in ("process", "first", "at 25%", "peak", "of it files", "final", "MiB / 1k rollouts after 25%", "CPU s", "cores"):
        table.add_column(col, justify="left" if col == "process" else "right")
    for m in memory_table(result):
        table.add_row(m["process"], f"{m['first_mb']:,.0f}", f"{m['quarter_mb']:,.0f}", f"{m['peak_mb']:,.0f}",
                      f"{m['peak_file_mb']:,.0f}", f"{m['final_mb']:,.0f}", f"{m['mb_per_1k_rollouts']:+.2f}", f"{m['cpu_s']:,.0f}",
                      f"{m['cpu_share']:.2f}")
    console.print(table)


def check(result: SoakResult) -> None:
    """Raise unless nothing was lost and every lag is zero."""
    bad = {k: v for k, v in lost_counts(result).items() if v}
    if bad or any(v for per in result.final_lag.values() for v in per.values()):
        raise RuntimeError(f"the soak lost data or left lag: {bad}, lag {result.final_lag}; "
                           f"dead letters by reason: {result.dead_letter_reasons}")


def run_sizes(ctx: Context, sizes: Sizes, results_dir: Path = RESULTS_DIR) -> Report:
    result = soak(ctx, sizes, results_dir)
    print_memory(ctx.console, result)
    if result.plot:
        ctx.console.print(f"plot: {result.plot}")
    return to_report(result)


def run(ctx: Context) -> Report:
    return run_sizes(ctx, QUICK if ctx.quick else DEFAULT)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.soak --rollouts N --spans M``: the soak at any size, printed and saved like
    every benchmark."""
    from .harness import machine, print_machine, print_report, save

    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=DEFAULT.rollouts)
    parser.add_argument("--spans", type=int, default=None,
                        help="spans in all (a multiple of --rollouts, at least 3 each; default 10 each)")
    parser.add_argument("--runners", type=int, default=DEFAULT.runners)
    parser.add_argument("--concurrency", type=int, default=DEFAULT.concurrency, help="agent slots per runner")
    parser.add_argument("--partitions", type=int, default=DEFAULT.partitions,
                        help="partitions of the per-rollout topics (runners beyond this many get no offers)")
    parser.add_argument("--in-flight", type=int, default=DEFAULT.in_flight)
    parser.add_argument("--sample-s", type=float, default=DEFAULT.sample_s)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    spans = args.spans if args.spans is not None else args.rollouts * DEFAULT.spans
    if args.rollouts < 1 or spans % args.rollouts or spans // args.rollouts < 3:
        parser.error("--spans must be a multiple of --rollouts with at least 3 spans per rollout")
    sizes = Sizes(rollouts=args.rollouts, spans=spans // args.rollouts, runners=args.runners,
                  concurrency=args.concurrency, partitions=args.partitions, in_flight=args.in_flight,
                  sample_s=args.sample_s,
                  stall_s=FULL.stall_s if args.rollouts > QUICK.rollouts else QUICK.stall_s)
    console = Console() if sys.stdout.isatty() else Console(width=150)
    m = machine()
    print_machine(console, m)
    ctx = Context(quick=False, agl=False, console=console)
    console.rule(f"[bold]soak[/]: {sizes.rollouts:,} rollouts x {sizes.spans} spans")
    start = time.perf_counter()
    try:
        report = run_sizes(ctx, sizes, args.results_dir)
    except Exception as exc:
        console.print(f"[red]soak failed:[/] {type(exc).__name__}: {exc}")
        return 1
    elapsed = time.perf_counter() - start
    print_report(console, f"soak ({elapsed:.0f} s)", report)
    path = save(args.results_dir, "soak", m, report, quick=False, elapsed_s=elapsed)
    console.print(f"saved {path}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
