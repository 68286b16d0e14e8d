"""report_queries: the latency of ``litstream report``'s queries over one million spans in chDB.

A fresh chDB directory gets N synthetic spans (10 per rollout: 9 LLM calls with a model and token usage under one
of three span names, 1 reward annotation; timestamps over the last 24 h, resources versions policy-v0..v19 in time
order), inserted as Arrow in batches of 50,000 as the sink does, plus 1% of them again (a redelivery, so FINAL
has work to do), and the rollouts' lifecycle events (enqueue, claim, two heartbeats, outcome; failed and timed-out
attempts retried once). Then the directory is closed and reopened, and each report query runs once (cold: no
cache in the process; the OS page cache is warm) and three more times (warm: the median). Every query reads with
FINAL; the benchmark checks the report counts N spans, not N plus the redelivered ones.

Agent Lightning 0.3.0 has no SQL store (spans live in the store process's memory, queried by rollout and attempt
only), so it has no row here.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.table import Table

from litstream.app import report
from litstream.infra.clickhouse import ClickHouse
from litstream.streams.event_rows import EVENT_SCHEMA
from litstream.streams.span_rows import ATTR_MAP, SPAN_SCHEMA

from .harness import Context, Report, Row, rate_row
from .lifecycle import AGL

TITLE = "report query latency over 1M spans in chDB (cold / warm), Arrow insert rate"


@dataclass(frozen=True)
class Sizes:
    spans: int
    spans_per_rollout: int = 10
    batch: int = 50_000
    warm_repeats: int = 3
    redelivered_share: float = 0.01


FULL = Sizes(spans=1_000_000)
QUICK = Sizes(spans=100_000, warm_repeats=1)
NAMES = np.array(["chat", "chat.completion", "tool.call"])
MODELS = np.array(["gpt-4o-mini", "qwen2.5-7b-instruct", "llama-3.1-8b"])
VERSIONS = 20
EVENT_QUERIES = frozenset({"attempts", "rollouts", "outcomes", "outcomes_over_time"})  # over rollout_events
KEYS = pa.array(["gen_ai.request.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
                 "agentlightning.reward.0.value"])


def _str(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def _attributes(is_reward: np.ndarray, model: np.ndarray, tok_in: np.ndarray, tok_out: np.ndarray,
                reward: np.ndarray) -> pa.Array:
    """SpanAttributes: {model, input tokens, output tokens} for an LLM span, {reward} for an annotation."""
    counts = np.where(is_reward, 1, 3)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    llm, rew = np.flatnonzero(~is_reward), np.flatnonzero(is_reward)
    n_llm = len(llm)
    key_idx = np.empty(offsets[-1], dtype=np.int64)
    item_idx = np.empty(offsets[-1], dtype=np.int64)
    starts = offsets[:-1]
    for slot in range(3):
        key_idx[starts[llm] + slot] = slot
        item_idx[starts[llm] + slot] = slot * n_llm + np.arange(n_llm)
    key_idx[starts[rew]] = 3
    item_idx[starts[rew]] = 3 * n_llm + np.arange(len(rew))
    items = pa.concat_arrays([pa.array(MODELS[model[llm]]), _str(tok_in[llm]), _str(tok_out[llm]),
                              _str(np.round(reward[rew], 3))])
    return pa.MapArray.from_arrays(pa.array(offsets), pc.take(KEYS, pa.array(key_idx)),
                                   pc.take(items, pa.array(item_idx)), type=ATTR_MAP)


def _empty_lists(n: int, values: pa.Array) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), values)


def synthetic_spans(n: int, per_rollout: int, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    rollouts = n // per_rollout
    ridx = np.repeat(np.arange(rollouts), per_rollout)
    seq = np.tile(np.arange(1, per_rollout + 1), rollouts)
    now = time.time_ns()
    start = now - 24 * 3600 * 10**9 + ridx * (24 * 3600 * 10**9 // rollouts) + seq * 50_000_000
    version = ridx * VERSIONS // rollouts
    is_reward = seq == per_rollout
    model = rng.integers(0, len(MODELS), n)
    names = np.where(is_reward, "agentlightning.annotation", NAMES[rng.integers(0, len(NAMES), n)])
    duration = np.where(is_reward, 1000, rng.lognormal(np.log(400e6), 0.6, n)).astype(np.uint64)
    reward = np.clip(rng.normal(0.3 + 0.5 * version / VERSIONS, 0.2), 0, 1)
    rollout_ids = pc.take(pa.array([f"ro-{i:012d}" for i in range(rollouts)]), pa.array(ridx))
    strings = {c: pa.array([""] * n) for c in ("ParentSpanId", "TraceState", "ScopeName", "ScopeVersion",
                                              "StatusMessage", "raw_json")}
    resource = pa.MapArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), pa.array(["service.name"] * n),
                                       pa.array(["agent"] * n), type=ATTR_MAP)
    cols: dict[str, Any] = {
        "Timestamp": pa.array(start, pa.timestamp("ns")),
        "TraceId": pc.take(pa.array([f"{i:032x}" for i in range(rollouts)]), pa.array(ridx)),
        "SpanId": pa.array([f"{i:016x}" for i in range(n)]),
        "SpanName": pa.array(names), "SpanKind": pa.array(np.where(is_reward, "Internal", "Client")),
        "ServiceName": pa.array(["agent"] * n), "ResourceAttributes": resource,
        "SpanAttributes": _attributes(is_reward, model, rng.integers(50, 2000, n), rng.integers(5, 500, n), reward),
        "Duration": pa.array(duration), "StatusCode": pa.array(np.where(rng.random(n) < 0.01, "Error", "Ok")),
        "Events.Timestamp": _empty_lists(n, pa.array([], pa.timestamp("ns"))),
        "Events.Name": _empty_lists(n, pa.array([], pa.string())),
        "Events.Attributes": _empty_lists(n, pa.array([], ATTR_MAP)),
        "Links.TraceId": _empty_lists(n, pa.array([], pa.string())),
        "Links.SpanId": _empty_lists(n, pa.array([], pa.string())),
        "Links.TraceState": _empty_lists(n, pa.array([], pa.string())),
        "Links.Attributes": _empty_lists(n, pa.array([], ATTR_MAP)),
        "rollout_id": rollout_ids, "attempt_id": rollout_ids, "sequence_id": pa.array(seq.astype(np.uint64)),
        "resources_id": pc.take(pa.array([f"policy-v{v}" for v in range(VERSIONS)]), pa.array(version)),
        "ingested_ns": pa.array(np.full(n, now, dtype=np.uint64)), "run_id": pa.array([""] * n), **strings,
    }
    return pa.Table.from_arrays([cols[f.name] for f in SPAN_SCHEMA], schema=SPAN_SCHEMA)


def synthetic_events(rollouts: int, seed: int = 11) -> pa.Table:
    """Per rollout: enqueued, attempt 1 started, 2 heartbeats, its outcome; failed/timeout get attempt 2."""
    rng = np.random.default_rng(seed)
    outcome = rng.choice(["succeeded", "failed", "timeout", "unresponsive"], rollouts, p=[0.85, 0.08, 0.05, 0.02])
    now = time.time_ns()
    rows: list[tuple[str, int, str, int, str]] = []  # type, rollout, attempt id, attempt number, status
    for r in range(rollouts):
        rows += [("RolloutEnqueued", r, "", 0, ""), ("AttemptStarted", r, f"at-{r}-1", 1, ""),
                 ("AttemptHeartbeat", r, f"at-{r}-1", 0, ""), ("AttemptHeartbeat", r, f"at-{r}-1", 0, ""),
                 ("AttemptStatusChanged", r, f"at-{r}-1", 0, str(outcome[r]))]
        if outcome[r] in ("failed", "timeout"):
            rows += [("AttemptStarted", r, f"at-{r}-2", 2, ""), ("AttemptStatusChanged", r, f"at-{r}-2", 0, "succeeded")]
    n = len(rows)
    ts = now - 24 * 3600 * 10**9 + np.array([row[1] for row in rows]) * (24 * 3600 * 10**9 // rollouts)
    cols: dict[str, Any] = {
        "timestamp": pa.array(ts, pa.timestamp("ns")), "event_type": pa.array([row[0] for row in rows]),
        "rollout_id": pa.array([f"ro-{row[1]:012d}" for row in rows]), "attempt_id": pa.array([row[2] for row in rows]),
        "sequence_id": pa.array([row[3] for row in rows], pa.uint32()), "status": pa.array([row[4] for row in rows]),
        "event_time": pa.array(ts // 1000, pa.timestamp("us")),
        "event_id": pa.array([f"{i:032x}" for i in range(n)]), "producer_id": pa.array(["bench"] * n),
        "producer_seq": pa.array(np.arange(n, dtype=np.uint64)), "kafka_partition": pa.array(np.zeros(n, np.uint32)),
        "kafka_offset": pa.array(np.arange(n, dtype=np.uint64)), "ingested_ns": pa.array(np.full(n, now, np.uint64)),
    }
    for name in ("worker_id", "resources_id", "mode", "error", "raw_json", "run_id"):
        cols[name] = pa.array([""] * n)
    return pa.Table.from_arrays([cols[f.name] for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)


def _insert(ch: ClickHouse, table: str, data: pa.Table, batch: int) -> float:
    start = time.perf_counter()
    for offset in range(0, data.num_rows, batch):
        ch.insert_arrow(table, data.slice(offset, batch))
    return time.perf_counter() - start


def _time(ch: ClickHouse, sql: str) -> float:
    start = time.perf_counter()
    ch.query(sql)
    return time.perf_counter() - start


def run(ctx: Context) -> Report:
    sizes = QUICK if ctx.quick else FULL
    workdir = Path(tempfile.mkdtemp(prefix="litstream-bench-report-"))
    dsn = f"chdb://{workdir / 'chdb'}"
    try:
        ctx.step(f"building {sizes.spans:,} synthetic spans and their rollouts' lifecycle events")
        spans = synthetic_spans(sizes.spans, sizes.spans_per_rollout)
        events = synthetic_events(sizes.spans // sizes.spans_per_rollout)
        redelivered = spans.slice(0, int(sizes.spans * sizes.redelivered_share))
        ch = ClickHouse(dsn, role="bench")
        ch.migrate()
        ctx.step(f"inserting (Arrow, batches of {sizes.batch:,}) into a fresh chDB directory")
        insert_s = _insert(ch, "spans", spans, sizes.batch)
        _insert(ch, "spans", redelivered, sizes.batch)
        events_s = _insert(ch, "rollout_events", events, sizes.batch)
        ch.close()

        ch = ClickHouse(dsn, role="bench")  # reopened: nothing of the inserts cached in the process
        try:
            lo, hi, _ = ch.query(report.SQL_SPAN_RANGE).rows[0]
            bucket = report.bucket_for(float(hi) - float(lo))
            timings: dict[str, list[float]] = {}
            for name, sql in report.QUERIES.items():
                filled = report.fill(sql, bucket)
                timings[name] = [_time(ch, filled) for _ in range(1 + sizes.warm_repeats)]
            whole = []
            for _ in range(1 + sizes.warm_repeats):
                start = time.perf_counter()
                built = report.build(ch.query)
                whole.append(time.perf_counter() - start)
            stored = ch.query("SELECT count() FROM spans FINAL").rows[0][0]
            rows_plain = ch.query("SELECT count() FROM spans").rows[0][0]
        finally:
            ch.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    counted = sum(r[1] for r in built.sections["reward_by_version"].rows) * sizes.spans_per_rollout
    if stored != sizes.spans or counted != sizes.spans:
        raise RuntimeError(f"FINAL counts {stored} spans and the report {counted}, expected {sizes.spans}")
    timings["report.build (all sections)"] = whole
    _print_latencies(ctx, timings, sizes)
    rows = [rate_row("Arrow insert into chDB (spans, batches of 50k)", [insert_s], sizes.spans,
                     note="insert_arrow through clickhouse-connect; synthetic spans with empty raw_json"),
            rate_row("Arrow insert into chDB (rollout_events)", [events_s], events.num_rows)]
    for name, samples in timings.items():
        cold, warm = samples[0], statistics.median(samples[1:]) if len(samples) > 1 else samples[0]
        n, what = (events.num_rows, "events") if name in EVENT_QUERIES else (sizes.spans, "spans")
        rows.append(Row(f"query {name}", n / warm, None, n,
                        f"cold {cold * 1e3:,.0f} ms, warm {warm * 1e3:,.0f} ms ({what}/s = n / warm)", samples))
    rows.append(Row(f"{AGL}: report queries", note="no SQL store (spans in the store process's memory, "
                                                   "query_spans by rollout/attempt only): no counterpart"))
    return Report(rows, {**asdict(sizes), "rows_before_final": rows_plain, "bucket_s": bucket,
                         "events": events.num_rows, "latency_s": timings})


def _print_latencies(ctx: Context, timings: dict[str, list[float]], sizes: Sizes) -> None:
    table = Table(title=f"report queries over {sizes.spans:,} spans (FINAL), ms", title_justify="left")
    for col in ("query", "cold", "warm (median)"):
        table.add_column(col, justify="left" if col == "query" else "right")
    for name, samples in timings.items():
        warm = statistics.median(samples[1:]) if len(samples) > 1 else samples[0]
        table.add_row(name, f"{samples[0] * 1e3:,.0f}", f"{warm * 1e3:,.0f}")
    ctx.console.print(table)
