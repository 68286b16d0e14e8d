"""The Agent Lightning 0.3.0 baseline: InMemoryLightningStore.add_span and add_many_spans, in spans/s.

Self-contained: the harness runs it with the python of a separate virtualenv (.venv-agl), since the
dependencies of agentlightning and of the project cannot share one environment; it imports nothing from
litstream. It reads its config as one JSON object on stdin, with the very span contents the litstream rows
encode:

    {"variants": [{"name", "duration_ns", "attributes", "events": [{"name", "offset_ns", "attributes"}],
                   "resource"}, ...],
     "rollouts": 50, "spans_per_rollout": 100, "batch": 50, "repeats": 3}

and prints one JSON line: {"version", "python", "pydantic", "n", "add_span": {...}, "add_many_spans": {...}}.
"""

from __future__ import annotations

import asyncio
import gc
import json
import platform
import secrets
import statistics
import sys
import time
from importlib.metadata import version
from typing import Any


def build_spans(cfg: dict[str, Any], attempts: list[tuple[str, str]]) -> list[Any]:
    """The spans of every rollout, rollout after rollout, each with its own ids and times."""
    from agentlightning.types import Event, OtelResource, Span, SpanContext, TraceStatus

    variants = cfg["variants"]
    spans: list[Any] = []
    now_ns = time.time_ns()
    for rollout_id, attempt_id in attempts:
        trace_id, root_id = secrets.token_hex(16), secrets.token_hex(8)
        root = SpanContext(trace_id=trace_id, span_id=root_id, is_remote=False, trace_state={})
        for seq in range(1, cfg["spans_per_rollout"] + 1):
            v = variants[len(spans) % len(variants)]
            start_ns = now_ns + len(spans) * 1000
            span_id = secrets.token_hex(8)
            spans.append(Span(
                rollout_id=rollout_id, attempt_id=attempt_id, sequence_id=seq, trace_id=trace_id,
                span_id=span_id, parent_id=root_id, name=v["name"], status=TraceStatus(status_code="OK"),
                attributes=v["attributes"],
                events=[Event(name=e["name"], attributes=e["attributes"],
                              timestamp=(start_ns + e["offset_ns"]) / 1e9) for e in v["events"]],
                links=[], start_time=start_ns / 1e9, end_time=(start_ns + v["duration_ns"]) / 1e9,
                context=SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_state={}),
                parent=root,
                resource=OtelResource(attributes={**v["resource"], "agentlightning.rollout_id": rollout_id,
                                                  "agentlightning.attempt_id": attempt_id}, schema_url=""),
            ))
    return spans


async def fresh_store(cfg: dict[str, Any]) -> tuple[Any, list[Any]]:
    """A new store with `rollouts` started rollouts (one attempt each), and their spans, not yet added."""
    from agentlightning.store.memory import InMemoryLightningStore

    store = InMemoryLightningStore()
    attempts = []
    for i in range(cfg["rollouts"]):
        rollout = await store.start_rollout(input={"task": i}, mode="train")
        attempts.append((rollout.rollout_id, rollout.attempt.attempt_id))
    return store, build_spans(cfg, attempts)


async def check(store: Any, spans: list[Any]) -> None:
    """The store really holds the first rollout's spans: a rate of lost writes is no rate."""
    first = spans[0].rollout_id
    held = await store.query_spans(first)
    expected = sum(1 for s in spans if s.rollout_id == first)
    if len(held) != expected:
        raise RuntimeError(f"store holds {len(held)} spans of {first}, expected {expected}")


async def bench(cfg: dict[str, Any]) -> dict[str, Any]:
    batch = cfg["batch"]
    samples: dict[str, list[float]] = {"add_span": [], "add_many_spans": []}
    n = 0
    for _ in range(cfg["repeats"]):
        store, spans = await fresh_store(cfg)
        gc.collect()
        start = time.perf_counter()
        for span in spans:  # sequential, as one client adding spans one call at a time
            await store.add_span(span)
        samples["add_span"].append(time.perf_counter() - start)
        await check(store, spans)

        store, spans = await fresh_store(cfg)
        gc.collect()
        start = time.perf_counter()
        # Spans come grouped by rollout: a batch is one rollout's when batch divides spans_per_rollout.
        for i in range(0, len(spans), batch):
            await store.add_many_spans(spans[i:i + batch])
        samples["add_many_spans"].append(time.perf_counter() - start)
        await check(store, spans)
        n = len(spans)
    return {
        "version": version("agentlightning"), "python": platform.python_version(),
        "pydantic": version("pydantic"), "n": n, "batch": batch, "rollouts": cfg["rollouts"],
        **{op: {"spans_per_s": n / statistics.median(s), "samples_s": s} for op, s in samples.items()},
    }


def main() -> None:
    cfg = json.load(sys.stdin)
    result = asyncio.run(bench(cfg))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
