"""timer_latency: how long after its deadline a timed-out attempt is marked `timeout`, with nobody calling.

litstream: an embedded broker, the lifecycle processor as a process, a LitStore in this process. M rollouts with
RolloutConfig(timeout_seconds=1) are enqueued, then claimed one by one at random moments (so that the deadlines
fall at every phase of the processor's 100 ms timer tick), then left alone. For each attempt the deadline is its
start_time (from the claim) + 1 s; two moments are taken from the snapshot that carries the `timeout`:

* fired: its ``updated_ns``, the timestamp of the AttemptStatusChanged the processor's timer wrote to the log
  (the processor's clock; each deadline wakes its timers, a 100 ms sweep behind them);
* visible: when the store's replica of the fold (its read model, folding rollout-events) applied that event, i.e.
  when a get_rollout_by_id/query_rollouts here would return it.

Agent Lightning 0.3.0: InMemoryLightningStore only looks for timeouts at the start of its health-checked methods,
at most once per scan_debounce_seconds. The same M rollouts are enqueued with timeout_seconds=1 and claimed at
random moments over one debounce period (so that the deadlines fall at every phase of the scan cycle, as in a
steady stream of calls), while one loop calls query_rollouts every 50 ms (so the store has calls to piggy-back
on); the moment each attempt is first returned as `timeout`, minus its deadline. Once with the default debounce
(10 s), once with 0 (a scan on every call).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from litstream.infra.settings import Settings
from litstream.schemas.models import EnqueueRolloutRequest, RolloutConfig
from litstream.streams.rollout_replica import Folded

from .harness import Context, Report, Row
from .lifecycle import AGL, agl_baseline, claim, latency_summary, open_store, pipeline

TITLE = "timeout detection latency past the deadline, with Agent Lightning 0.3.0's in-memory store"


@dataclass(frozen=True)
class Sizes:
    m: int
    timeout_s: float
    poll_s: float  # the baseline's polling period
    agl_debounces: tuple[float, ...]


TICK_S = 0.1  # the lifecycle processor's timer sweep (streams/lifecycle.py; a deadline also wakes it)

FULL = Sizes(m=50, timeout_s=1.0, poll_s=0.05, agl_debounces=(10.0, 0.0))
QUICK = Sizes(m=10, timeout_s=1.0, poll_s=0.05, agl_debounces=(10.0, 0.0))


@dataclass
class Seen:
    deadline: float  # epoch seconds: attempt start_time + timeout
    fired: float  # epoch seconds: updated_ns of the first snapshot with the attempt in `timeout`
    visible: float  # epoch seconds: when that snapshot reached this process's view


async def litstream_latencies(ctx: Context, sizes: Sizes, settings: Settings) -> dict[str, Seen]:
    store = await open_store(settings)
    seen: dict[str, Seen] = {}
    def on_fold(done: Folded) -> None:  # runs on the replica's follower thread, for every accepted event
        snap = done.snapshot
        attempt = snap.attempts[-1] if snap is not None and snap.attempts else None
        if snap is not None and attempt is not None and attempt.status == "timeout" and snap.rollout_id not in seen:
            seen[snap.rollout_id] = Seen(deadline=attempt.start_time + sizes.timeout_s,
                                         fired=snap.updated_ns / 1e9, visible=time.time())

    store.rollouts.on_fold(on_fold)
    try:
        config = RolloutConfig(timeout_seconds=sizes.timeout_s)
        ctx.step(f"litstream: {sizes.m} rollouts with timeout_seconds={sizes.timeout_s:g}, claimed, never finished")
        rollouts = await store.enqueue_many_rollouts(
            [EnqueueRolloutRequest(input={"task": i}, mode="train", config=config) for i in range(sizes.m)])
        # One claim at a time, each after a random pause of up to one timer tick: the deadlines then fall at every
        # phase of the processor's tick (claims back to back would all land at the same phase of it).
        rng = random.Random(7)
        claimed = []
        for _ in range(sizes.m):
            await asyncio.sleep(rng.uniform(0, TICK_S))
            claimed += await claim(store, 1, 1)
        last_deadline = max(r.attempt.start_time for r in claimed) + sizes.timeout_s
        give_up = last_deadline + 30.0
        while len(seen) < sizes.m and time.time() < give_up:
            await asyncio.sleep(0.1)
        if len(seen) < sizes.m:
            raise RuntimeError(f"{len(seen)} of {sizes.m} attempts were marked timeout within 30 s of their deadline")
        statuses = {(await store.get_rollout_by_id(r.rollout_id)).status for r in rollouts}  # type: ignore[union-attr]
        if statuses != {"failed"}:  # no retries configured: a timed-out attempt fails its rollout
            raise RuntimeError(f"rollouts ended {sorted(statuses)}, expected failed")
    finally:
        await store.close()
    return seen


def _ms(summary: dict[str, float]) -> str:
    return f"p50 {summary['p50_ms']:,.0f} ms · p99 {summary['p99_ms']:,.0f} ms · max {summary['max_ms']:,.0f} ms"


def latency_row(what: str, late_s: list[float], note: str) -> tuple[Row, dict[str, float]]:
    summary = latency_summary(late_s)
    return Row(what, n=len(late_s), note=f"{_ms(summary)} past the deadline; {note}",
               value=summary["p99_ms"]), summary  # the value: the summary's timer row


def agl_rows(ctx: Context, sizes: Sizes) -> tuple[list[tuple[Row, dict[str, float] | None]], dict[str, Any]]:
    labels = [f"{AGL} InMemory, scan_debounce_seconds={d:g}" + (" (default)" if d == 10.0 else "")
              for d in sizes.agl_debounces]
    config = {"mode": "timer_latency", "m": sizes.m, "timeout_s": sizes.timeout_s, "poll_s": sizes.poll_s,
              "debounces": list(sizes.agl_debounces)}
    result, missing = agl_baseline(ctx, config, labels)
    if result is None:
        return [(row, None) for row in missing], {}
    out: list[tuple[Row, dict[str, float] | None]] = []
    for label, run in zip(labels, result["runs"], strict=True):
        if not run["late_s"]:
            out.append((Row(label, note=f"no attempt was seen as timeout ({run['calls']} calls)"), None))
            continue
        missed = f"; {run['missed']} never seen" if run["missed"] else ""
        out.append(latency_row(label, run["late_s"],
                               f"claims spread over {run['spread_s']:g} s; query_rollouts every "
                               f"{sizes.poll_s * 1000:.0f} ms from one loop ({run['calls']} calls){missed}"))
    return out, {"agl": {k: result[k] for k in ("version", "python", "pydantic", "m", "timeout_s", "poll_s", "runs")}}


def print_latencies(ctx: Context, rows: list[tuple[Row, dict[str, float] | None]]) -> None:
    table = Table(title="timer_latency: ms past the deadline", title_justify="left")
    table.add_column("what")
    for col in ("p50 ms", "p99 ms", "max ms", "n"):
        table.add_column(col, justify="right")
    for row, summary in rows:
        if summary is None:
            table.add_row(row.what, "-", "-", "-", "")
        else:
            table.add_row(row.what, f"{summary['p50_ms']:,.0f}", f"{summary['p99_ms']:,.0f}",
                          f"{summary['max_ms']:,.0f}", f"{row.n or 0:,}")
    ctx.console.print(table)


def run(ctx: Context) -> Report:
    sizes = QUICK if ctx.quick else FULL
    with pipeline(ctx, "timer_latency") as settings:
        seen = asyncio.run(litstream_latencies(ctx, sizes, settings))
    fired = [s.fired - s.deadline for s in seen.values()]
    visible = [s.visible - s.deadline for s in seen.values()]
    rows: list[tuple[Row, dict[str, float] | None]] = [
        latency_row("litstream timeout fired (processor)", fired,
                    "the timer's event timestamp; each deadline wakes the timers; no calls needed"),
        latency_row("litstream timeout visible (LitStore view)", visible,
                    "the snapshot's arrival in this process: fired + the trip through the log"),
    ]
    more, extra = agl_rows(ctx, sizes)
    rows += more
    print_latencies(ctx, rows)
    params = {**asdict(sizes), **extra,
              "litstream_late_s": {"fired": sorted(fired), "visible": sorted(visible)},
              "summary_ms": {row.what: summary for row, summary in rows if summary is not None}}
    return Report([row for row, _ in rows], params)
