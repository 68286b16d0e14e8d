"""rollout_cycles: rollouts/s through enqueue -> claim -> succeeded, folded and queryable, on the real pipeline.

litstream: an embedded broker, the lifecycle processor as a process, a LitStore in this process. N rollouts go
through three phases, each a Store API call per rollout that returns once its effect is readable from this store
(read-your-writes): enqueue_rollout (once the broker holds the event: nothing can refuse a new rollout), then claims
(dequeue, which first waits for this store's enqueues to be folded) until all are claimed, then
update_attempt(rid, "latest", status="succeeded") (once the broker holds the event and this store's replica of the
fold has folded it: one trip); then wait_for_rollouts until all succeeded.
Once with one call in flight, once with 64 (asyncio tasks over one store), then enqueue_many_rollouts on its own
(as many rollouts as each baseline run enqueues).

Agent Lightning 0.3.0: InMemoryLightningStore (default scan_debounce_seconds), the same phases with the same calls,
sequential and with 64 asyncio tasks, in its own virtualenv.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from litstream.schemas.models import EnqueueRolloutRequest
from litstream.workers.store import LitStore

from .harness import Context, Report, Row, rate_row
from .lifecycle import AGL, agl_baseline, claim, in_flight, open_store, pipeline, rate

TITLE = "rollout cycles/s (enqueue -> claim -> succeeded) through LitStore, with Agent Lightning 0.3.0 in-memory"


@dataclass(frozen=True)
class Sizes:
    sequential: int  # rollouts through the one-in-flight cycle (each call is a trip through the log)
    concurrent: int  # rollouts through the 64-in-flight cycle
    concurrency: int
    batch: int  # enqueue_many_rollouts and dequeue_many_rollouts batch
    agl_n: int  # rollouts of each baseline run, and of litstream's enqueue_many (the same size on both sides)
    agl_repeats: int


FULL = Sizes(sequential=50, concurrent=500, concurrency=64, batch=64, agl_n=2000, agl_repeats=3)
QUICK = Sizes(sequential=10, concurrent=30, concurrency=64, batch=64, agl_n=200, agl_repeats=1)


def _task(i: int) -> dict[str, Any]:
    return {"task": i}  # the baseline enqueues the same input


async def cycle(store: LitStore, n: int, concurrency: int, batch: int) -> dict[str, float]:
    """n rollouts through enqueue, claim and success; wall seconds of each phase."""
    t0 = time.perf_counter()
    rollouts = await in_flight(list(range(n)),
                               lambda i: store.enqueue_rollout(_task(i), mode="train"), concurrency)
    t1 = time.perf_counter()
    claimed = await claim(store, n, 1 if concurrency == 1 else batch)
    t2 = time.perf_counter()
    await in_flight(claimed, lambda r: store.update_attempt(r.rollout_id, "latest", status="succeeded"),
                    concurrency)
    t3 = time.perf_counter()
    ids = [r.rollout_id for r in rollouts]
    done = await store.wait_for_rollouts(rollout_ids=ids, timeout=60.0)
    t4 = time.perf_counter()
    if {r.rollout_id for r in claimed} != set(ids):
        raise RuntimeError("the claims did not return the rollouts just enqueued")
    succeeded = sum(1 for r in done if r.status == "succeeded")
    if succeeded != n:
        raise RuntimeError(f"{succeeded} of {n} rollouts succeeded")
    # Queryable: every rollout's latest attempt reads back as succeeded from this process's view.
    page = await store.query_rollouts(rollout_id_in=ids, status_in=["succeeded"])
    if page.total != n:
        raise RuntimeError(f"query_rollouts found {page.total} of {n} succeeded rollouts")
    return {"total": t4 - t0, "enqueue": t1 - t0, "dequeue": t2 - t1, "update": t3 - t2, "wait": t4 - t3}


async def enqueue_many(store: LitStore, n: int, batch: int) -> float:
    """enqueue_many_rollouts of n rollouts in batches; they stay queued (the pipeline stops right after)."""
    requests = [EnqueueRolloutRequest(input=_task(i), mode="train") for i in range(n)]
    start = time.perf_counter()
    for i in range(0, n, batch):
        got = await store.enqueue_many_rollouts(requests[i:i + batch])
        if len(got) != len(requests[i:i + batch]):
            raise RuntimeError("enqueue_many_rollouts returned fewer rollouts than asked")
    return time.perf_counter() - start


async def litstream_runs(ctx: Context, sizes: Sizes, settings: Any) -> dict[str, Any]:
    store = await open_store(settings)
    try:
        ctx.step(f"litstream: {sizes.sequential} rollouts, one call in flight")
        sequential = await cycle(store, sizes.sequential, 1, sizes.batch)
        ctx.step(f"litstream: {sizes.concurrent} rollouts, {sizes.concurrency} calls in flight")
        concurrent = await cycle(store, sizes.concurrent, sizes.concurrency, sizes.batch)
        ctx.step(f"litstream: enqueue_many_rollouts of {sizes.agl_n} rollouts, batches of {sizes.batch}")
        many = await enqueue_many(store, sizes.agl_n, sizes.batch)
    finally:
        await store.close()
    return {"sequential": sequential, "concurrent": concurrent, "enqueue_many": many}


def _phases(n: int, phases: dict[str, float], claim_call: str, in_flight_note: str) -> str:
    return (f"enqueue_rollout {rate(n, phases['enqueue'])} · {claim_call} {rate(n, phases['dequeue'])} · "
            f"update_attempt(succeeded) {rate(n, phases['update'])}{in_flight_note}")


def litstream_rows(sizes: Sizes, runs: dict[str, Any]) -> list[Row]:
    seq, conc = runs["sequential"], runs["concurrent"]
    k = sizes.concurrency
    return [
        rate_row("litstream cycles, 1 call in flight", [seq["total"]], sizes.sequential,
                 note=_phases(sizes.sequential, seq, "dequeue_rollout", "")),
        rate_row(f"litstream cycles, {k} calls in flight", [conc["total"]], sizes.concurrent,
                 note=_phases(sizes.concurrent, conc, f"dequeue_many_rollouts({sizes.batch})",
                              f"; {k} tasks for enqueue and update, claims one at a time (the store's limit)")),
        rate_row(f"litstream enqueue_many_rollouts({sizes.batch})", [runs["enqueue_many"]], sizes.agl_n,
                 note="rollouts/s; each batch returns once the broker holds it, with the state the pure fold gives (the processor folds them meanwhile)"),
    ]


def agl_rows(ctx: Context, sizes: Sizes) -> tuple[list[Row], dict[str, Any]]:
    k = sizes.concurrency
    labels = (f"{AGL} InMemory cycles, sequential", f"{AGL} InMemory cycles, {k} tasks",
              f"{AGL} InMemory enqueue_many_rollouts({sizes.batch})")
    config = {"mode": "rollout_cycles", "n": sizes.agl_n, "concurrency": k, "batch": sizes.batch,
              "repeats": sizes.agl_repeats}
    result, missing = agl_baseline(ctx, config, labels)
    if result is None:
        return missing, {}
    n = int(result["n"])
    rows = []
    for label, key, how in ((labels[0], "sequential", ""),
                            (labels[1], "concurrent", f"; {k} tasks for every phase")):
        samples = result[key]
        median = {phase: statistics.median(v) for phase, v in samples.items()}
        rows.append(rate_row(label, samples["total"], n, note=_phases(n, median, "dequeue_rollout", how)
                             + "; default scan_debounce_seconds; median of the runs"))
    rows.append(rate_row(labels[2], result["enqueue_many"], n,
                         note="rollouts/s, in-process, nothing durable"))
    return rows, {"agl": {key: result[key] for key in ("version", "python", "pydantic", "n", "sequential",
                                                          "concurrent", "enqueue_many")}}


def run(ctx: Context) -> Report:
    sizes = QUICK if ctx.quick else FULL
    with pipeline(ctx, "rollout_cycles") as settings:
        runs = asyncio.run(litstream_runs(ctx, sizes, settings))
    rows = litstream_rows(sizes, runs)
    more, extra = agl_rows(ctx, sizes)
    params = {**asdict(sizes), "litstream_phases_s": runs, **extra,
              "rate": "cycles/s for the cycle rows (rollouts through all three phases), rollouts/s otherwise"}
    return Report(rows + more, params)
