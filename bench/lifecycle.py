"""What the rollout-lifecycle benchmarks share (rollout_cycles, timer_latency, replay_rate): the pipeline they
run on, bounded concurrency, percentiles, and the Agent Lightning baseline's labels.

The pipeline is real: an embedded broker (Apache Kafka) of its own with the catalogue's topics, the lifecycle
processor as a process of its own (``litstream process lifecycle`` through ``app.stack.Stack``), and the store
(``LitStore``) in the benchmark's process. Everything is stopped on the way out, whatever happens.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from litstream.app.stack import Stack
from litstream.infra.broker import KafkaBroker
from litstream.infra.kafka import create_topics
from litstream.infra.runtime import tune_gc_for_service
from litstream.infra.settings import Settings
from litstream.schemas.models import AttemptedRollout
from litstream.workers.store import LitStore

from .harness import AGL_REQUIREMENT, Context, Row, run_agl_reference

T = TypeVar("T")
R = TypeVar("R")

PARTITIONS = 4  # the settings' default, as `litstream up` runs it
AGL = AGL_REQUIREMENT.replace("==", " ")  # "agentlightning 0.3.0", the prefix of every baseline row


@contextmanager
def embedded_broker(ctx: Context, name: str) -> Iterator[tuple[KafkaBroker, Settings]]:
    """An embedded broker of this benchmark's own, the catalogue's topics created, and a scratch data dir; the
    broker's log under it, where `litstream up` keeps it (``<data_dir>/kafka``)."""
    with tempfile.TemporaryDirectory(prefix=f"litstream-bench-{name}-", ignore_cleanup_errors=True) as tmp:
        data = Path(tmp)
        ctx.step(f"starting the embedded broker (data dir {data})")
        with KafkaBroker(data / "data" / "kafka", log_path=data / "broker.log") as broker:
            settings = Settings(bootstrap_servers=broker.bootstrap, partitions=PARTITIONS, data_dir=data / "data",
                                topic_prefix=f"bench-{name.replace('_', '-')}-{secrets.token_hex(3)}")
            create_topics(settings)
            yield broker, settings


@contextmanager
def broker_settings(ctx: Context, name: str) -> Iterator[Settings]:
    """The settings of :func:`embedded_broker`, for benchmarks that need only them."""
    with embedded_broker(ctx, name) as (_, settings):
        yield settings


@contextmanager
def pipeline(ctx: Context, name: str) -> Iterator[Settings]:
    """The broker of `broker_settings` plus the lifecycle processor, running and ready."""
    with broker_settings(ctx, name) as settings, Stack(settings) as stack:
        ctx.step("starting the lifecycle processor")
        stack.start("lifecycle", "process", "lifecycle")
        stack.wait_ready("lifecycle", "lifecycle")
        yield settings


async def open_store(settings: Settings) -> LitStore:
    """A store whose views have read their topics, and whose offers consumer has joined the runners' group.

    The first dequeue joins the group (a group join takes a moment): done here, on an empty queue, so
    that no clock pays it. The caller closes the store. This process's collector is set as the gateway's, which
    hosts the store in the stack (``infra.runtime``).
    """
    tune_gc_for_service()
    store = LitStore(settings)
    try:
        await store.wait_until_ready()
        if await store.dequeue_rollout() is not None:
            raise RuntimeError("the benchmark's fresh topics already had a rollout on offer")
    except BaseException:
        await store.close()
        raise
    return store


async def in_flight(items: Sequence[T], fn: Callable[[T], Awaitable[R]], concurrency: int) -> list[R]:
    """``fn(item)`` for every item with at most ``concurrency`` calls awaiting at once; results in item order."""
    results: list[Any] = [None] * len(items)
    index = iter(range(len(items)))

    async def worker() -> None:
        for i in index:  # one shared iterator: each task takes the next item when it is free
            results[i] = await fn(items[i])

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(items))))))
    return results


async def claim(store: LitStore, n: int, batch: int, stall_s: float = 30.0) -> list[AttemptedRollout]:
    """Claim n rollouts: ``dequeue_rollout`` one by one (batch 1) or ``dequeue_many_rollouts(limit=batch)``.

    LitStore claims one offer at a time whatever the call (each claim waits for its outcome before the offer is
    committed), and concurrent dequeue calls on one store are serialised (``LitStore.dequeue_many_rollouts``), so
    this is the claim path at its best. Raises if no offer arrives for ``stall_s``.
    """
    claimed: list[AttemptedRollout] = []
    last_progress = time.monotonic()
    while len(claimed) < n:
        if batch == 1:
            got = await store.dequeue_rollout()
            new = [got] if got is not None else []
        else:
            new = await store.dequeue_many_rollouts(limit=min(batch, n - len(claimed)))
        if new:
            claimed.extend(new)
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > stall_s:
            raise RuntimeError(f"claimed {len(claimed)} of {n} rollouts; no offer for {stall_s:.0f}s")
    return claimed


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max in milliseconds."""
    return {"p50_ms": percentile(seconds, 50) * 1000, "p99_ms": percentile(seconds, 99) * 1000,
            "max_ms": max(seconds) * 1000}


def agl_baseline(ctx: Context, config: dict[str, Any], labels: Sequence[str],
                 timeout: float = 600.0) -> tuple[dict[str, Any] | None, list[Row]]:
    """Run one mode of bench/agl_reference.py; (its result, []) or (None, rows that say why there is none)."""
    if not ctx.agl:
        return None, [Row(f"{AGL} baseline", note="skipped (--no-agl)")]
    ctx.step(f"{AGL} baseline ({config['mode']}) in its own virtualenv")
    result = run_agl_reference(config, ctx.console, timeout=timeout)
    if isinstance(result, str):
        return None, [Row(label, note=f"not run: {result}") for label in labels]
    return result, []


def rate(n: float, seconds: float) -> str:
    return f"{n / seconds:,.0f}/s" if seconds > 0 else "-"
