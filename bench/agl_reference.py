"""The Agent Lightning 0.3.0 baselines, on its InMemoryLightningStore.

Self-contained: the harness runs it with the python of a separate virtualenv (.venv-agl), since the
dependencies of agentlightning and of the project cannot share one environment; it imports nothing from
litstream. It reads its config as one JSON object on stdin and prints one JSON line of results. The config's
"mode" picks the baseline ("spans" when absent):

* "spans": add_span and add_many_spans, in spans/s, with the very span contents the litstream rows encode:

      {"variants": [{"name", "duration_ns", "attributes", "events": [{"name", "offset_ns", "attributes"}],
                     "resource"}, ...],
       "rollouts": 50, "spans_per_rollout": 100, "batch": 50, "repeats": 3}

  -> {"version", "python", "pydantic", "n", "add_span": {...}, "add_many_spans": {...}}

* "rollout_cycles": enqueue_rollout -> dequeue_rollout -> update_attempt(status="succeeded") of n rollouts,
  phase after phase, then wait_for_rollouts; once one call at a time and once with `concurrency` asyncio tasks:

      {"mode": "rollout_cycles", "n": 2000, "concurrency": 64, "batch": 64, "repeats": 3}

  -> {..., "sequential": {"total": [s...], "enqueue": [...], "dequeue": [...], "update": [...]},
      "concurrent": {...}, "enqueue_many": [s...]}

* "timer_latency": m rollouts with RolloutConfig(timeout_seconds=...), dequeued at random moments over one
  debounce period and never finished, while one loop calls query_rollouts (a health-checked method: the store
  only looks for timeouts inside such calls) every `poll_s`; for each scan_debounce_seconds given, how long after
  its deadline each attempt was first returned as timeout:

      {"mode": "timer_latency", "m": 50, "timeout_s": 1.0, "poll_s": 0.05, "debounces": [10.0, 0.0]}

  -> {..., "runs": [{"debounce": 10.0, "late_s": [...], "missed": 0, "calls": 230, "spread_s": 10.0}, ...]}

* "apply_ops": the operations a rollout-events log of the same rollouts holds, applied through the API one call
  at a time: enqueue_rollout, dequeue_rollout, `heartbeats` x update_attempt(last_heartbeat_time=...) and
  update_attempt(status="succeeded") per rollout, phase after phase as in the log:

      {"mode": "apply_ops", "rollouts": 2000, "heartbeats": 7, "repeats": 3}

  -> {..., "ops": 20000, "samples_s": [...]}

* "span_ingest": spans/s into a store over its ingest paths, with the same span contents as "spans" (its
  `variants`). With `url` (a litstream gateway): the stock LightningStoreClient's add_span against `url`, `rest_n`
  spans per concurrency in `concurrencies` (one rollout each, started with the client's start_rollout). Without
  `url`: a LightningStoreServer(InMemoryLightningStore()) in thread launch mode on a free port, then the same
  client rows against it, the OTLP/HTTP exporter (BatchSpanProcessor, `otlp_batch`) against its /v1/traces with
  `otlp_n` spans, and in-process add_otel_span of `sdk_n` spans made by an opentelemetry-sdk tracer:

      {"mode": "span_ingest", "variants": [...], "url": null, "rest_n": 3000, "concurrencies": [1, 16],
       "otlp_n": 20000, "otlp_batch": 512, "sdk_n": 20000}

  -> {..., "rest": {"1": s, "16": s}, "otlp": {"end_s", "flush_s"}, "add_otel_span": {"end_s", "total_s"}}

* "agent_loop": the stock LightningStoreClient's agent loop, `workers` agents at once (asyncio tasks, one client
  each), `n` rollouts in all: enqueue_rollout -> dequeue_rollout (again after `empty_sleep_s` while the queue
  looks empty) -> `spans` x (get_next_span_sequence_id + add_span) -> update_attempt(status="succeeded"), then one
  wait_for_rollouts over every rollout. With `url`, against that server (a litstream gateway); without, against
  a LightningStoreServer(InMemoryLightningStore()) started as a process of its own (as a gateway is):

      {"mode": "agent_loop", "url": null, "n": 400, "workers": [1, 16], "spans": 10, "variants": [...],
       "empty_sleep_s": 0.01, "warmup": 100}

  `warmup` rollouts go through the same loop first, untimed, with the most agents (0: none). `cpu_pids`
  ({group: [pid, ...]}, given with `url`) names the server's processes; without `url`, the reference server's
  own. Each run reports the CPU (user + system) that each group's processes and all their descendants spent on
  it, per rollout, and apart (``"<group> jit"``, included in the group's figure) what a JVM's JIT compiler
  threads among them spent: the warm-up of a fresh broker.

  -> {..., "runs": {"16": {"wall_s", "rollouts", "empty_dequeues", "calls": {kind: {"n", "p50_ms", "p90_ms",
      "p99_ms"}}, "cpu_ms_per_rollout": {group: ms, "<group> jit": ms}}}}

* "adapter": TracerTraceToTriplet().adapt over traces given as span dicts, only the adapt calls timed:

      {"mode": "adapter", "traces": [[{"span_id", "parent_id", "name", "start", "end", "attributes"}, ...]],
       "repeats": 3}

  -> {..., "traces": T, "triplets": n, "samples_s": [...]}
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


# --- the rollout lifecycle ----------------------------------------------------------------------------------


def versions() -> dict[str, Any]:
    return {"version": version("agentlightning"), "python": platform.python_version(),
            "pydantic": version("pydantic")}


async def in_flight(items: list[Any], fn: Any, concurrency: int) -> list[Any]:
    """fn(item) for every item, with at most `concurrency` calls awaiting at once; results in item order."""
    results: list[Any] = [None] * len(items)
    index = iter(range(len(items)))

    async def worker() -> None:
        for i in index:
            results[i] = await fn(items[i])

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(items))))))
    return results


async def claim_all(store: Any, n: int, concurrency: int) -> list[Any]:
    """dequeue_rollout until n rollouts are claimed, from `concurrency` tasks; fewer than n is an error."""
    claimed: list[Any] = []

    async def worker() -> None:
        while len(claimed) < n:
            got = await store.dequeue_rollout()
            if got is None:  # the queue is empty (another task may still be finishing the last claim)
                return
            claimed.append(got)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    if len(claimed) != n:
        raise RuntimeError(f"claimed {len(claimed)} of {n} rollouts before the queue ran dry")
    return claimed


async def one_cycle_run(n: int, concurrency: int) -> dict[str, float]:
    """A fresh store (default scan_debounce_seconds), then n rollouts through enqueue, claim, success."""
    from agentlightning.store.memory import InMemoryLightningStore

    store = InMemoryLightningStore()
    gc.collect()
    t0 = time.perf_counter()
    rollouts = await in_flight(list(range(n)), lambda i: store.enqueue_rollout(input={"task": i}, mode="train"),
                               concurrency)
    t1 = time.perf_counter()
    claimed = await claim_all(store, n, concurrency)
    t2 = time.perf_counter()
    await in_flight(claimed, lambda r: store.update_attempt(r.rollout_id, "latest", status="succeeded"), concurrency)
    t3 = time.perf_counter()
    done = await store.wait_for_rollouts(rollout_ids=[r.rollout_id for r in rollouts], timeout=30.0)
    t4 = time.perf_counter()
    if len(done) != n or any(r.status != "succeeded" for r in done):
        raise RuntimeError(f"{sum(r.status == 'succeeded' for r in done)} of {n} rollouts succeeded")
    return {"total": t4 - t0, "enqueue": t1 - t0, "dequeue": t2 - t1, "update": t3 - t2, "wait": t4 - t3}


async def enqueue_many_run(n: int, batch: int) -> float:
    from agentlightning.store.memory import InMemoryLightningStore
    from agentlightning.types import EnqueueRolloutRequest

    store = InMemoryLightningStore()
    requests = [EnqueueRolloutRequest(input={"task": i}, mode="train") for i in range(n)]
    gc.collect()
    start = time.perf_counter()
    for i in range(0, n, batch):
        await store.enqueue_many_rollouts(requests[i:i + batch])
    return time.perf_counter() - start


async def rollout_cycles(cfg: dict[str, Any]) -> dict[str, Any]:
    n, repeats = cfg["n"], cfg["repeats"]
    out: dict[str, Any] = {**versions(), "n": n, "concurrency": cfg["concurrency"], "batch": cfg["batch"]}
    for label, concurrency in (("sequential", 1), ("concurrent", cfg["concurrency"])):
        runs = [await one_cycle_run(n, concurrency) for _ in range(repeats)]
        out[label] = {phase: [r[phase] for r in runs] for phase in runs[0]}
    out["enqueue_many"] = [await enqueue_many_run(n, cfg["batch"]) for _ in range(repeats)]
    return out


async def timer_run(m: int, timeout_s: float, poll_s: float, debounce: float, seed: int) -> dict[str, Any]:
    """m rollouts claimed at random moments over one debounce period (so their deadlines fall at every phase of
    the scan cycle, as in a steady stream of calls), while one loop polls query_rollouts."""
    import random

    from agentlightning.store.memory import InMemoryLightningStore
    from agentlightning.types import RolloutConfig

    rng = random.Random(seed)
    store = InMemoryLightningStore(scan_debounce_seconds=debounce)
    config = RolloutConfig(timeout_seconds=timeout_s)
    for i in range(m):
        await store.enqueue_rollout(input={"task": i}, mode="train", config=config)
    spread_s = max(debounce, 2 * poll_s)
    offsets = sorted(rng.uniform(0, spread_s) for _ in range(m))
    deadlines: dict[str, float] = {}

    async def claimer() -> None:
        start = time.monotonic()
        for offset in offsets:
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
            got = await store.dequeue_rollout()
            if got is None:
                raise RuntimeError("the queue ran dry")
            deadlines[got.rollout_id] = got.attempt.start_time + timeout_s

    claims = asyncio.ensure_future(claimer())
    late: dict[str, float] = {}
    calls = 0
    give_up = time.time() + spread_s + timeout_s + debounce + 5.0  # every scan comes within one debounce period
    while len(late) < m and time.time() < give_up:
        page = await store.query_rollouts()  # health-checked: the scan for unhealthy rollouts runs first
        seen = time.time()
        calls += 1
        for r in page.items:
            attempt = getattr(r, "attempt", None)
            if r.rollout_id not in late and attempt is not None and attempt.status == "timeout":
                late[r.rollout_id] = seen - deadlines[r.rollout_id]
        await asyncio.sleep(poll_s)
    await claims
    return {"debounce": debounce, "late_s": sorted(late.values()), "missed": m - len(late), "calls": calls,
            "spread_s": spread_s}


async def timer_latency(cfg: dict[str, Any]) -> dict[str, Any]:
    runs = [await timer_run(cfg["m"], cfg["timeout_s"], cfg["poll_s"], float(d), seed=i)
            for i, d in enumerate(cfg["debounces"])]
    return {**versions(), "m": cfg["m"], "timeout_s": cfg["timeout_s"], "poll_s": cfg["poll_s"], "runs": runs}


async def apply_run(rollouts: int, heartbeats: int) -> tuple[float, int]:
    from agentlightning.store.memory import InMemoryLightningStore

    store = InMemoryLightningStore()
    ops = 0
    gc.collect()
    start = time.perf_counter()
    ids = []
    for i in range(rollouts):
        ids.append((await store.enqueue_rollout(input={"task": i}, mode="train")).rollout_id)
    ops += rollouts
    claimed = await claim_all(store, rollouts, 1)
    ops += rollouts
    for _ in range(heartbeats):
        for r in claimed:
            await store.update_attempt(r.rollout_id, r.attempt.attempt_id, last_heartbeat_time=time.time())
        ops += rollouts
    for r in claimed:
        await store.update_attempt(r.rollout_id, r.attempt.attempt_id, status="succeeded")
    ops += rollouts
    seconds = time.perf_counter() - start
    done = await store.query_rollouts(status_in=["succeeded"])
    if done.total != rollouts:
        raise RuntimeError(f"{done.total} of {rollouts} rollouts succeeded")
    return seconds, ops


async def apply_ops(cfg: dict[str, Any]) -> dict[str, Any]:
    runs = [await apply_run(cfg["rollouts"], cfg["heartbeats"]) for _ in range(cfg["repeats"])]
    return {**versions(), "rollouts": cfg["rollouts"], "heartbeats": cfg["heartbeats"], "ops": runs[0][1],
            "samples_s": [seconds for seconds, _ in runs]}


# --- span ingest --------------------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def otel_tracer(resource: dict[str, Any], processor: Any) -> tuple[Any, Any]:
    """A TracerProvider of its own (not the global one) with `processor`, and a tracer from it."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(processor)
    return provider, provider.get_tracer("litstream.bench.span_ingest")


def make_span(tracer: Any, variants: list[dict[str, Any]], i: int) -> Any:
    """One LLM-call span, ended: the variant's attributes and events, a response id of its own."""
    v = variants[i % len(variants)]
    span = tracer.start_span(v["name"], attributes={**v["attributes"], "gen_ai.response.id": f"chatcmpl-{i:024x}"})
    for e in v["events"]:
        span.add_event(e["name"], e["attributes"])
    span.end()
    return span


async def rest_rows(client: Any, cfg: dict[str, Any], held: Any) -> dict[str, float]:
    """add_span of rest_n spans per concurrency, each run on a rollout of its own; `held(rid)` counts its spans."""
    out: dict[str, float] = {}
    for concurrency in cfg["concurrencies"]:
        rollout = await client.start_rollout(input={"task": f"rest-{concurrency}"}, mode="train")
        spans = build_spans({"variants": cfg["variants"], "spans_per_rollout": cfg["rest_n"]},
                            [(rollout.rollout_id, rollout.attempt.attempt_id)])
        gc.collect()
        start = time.perf_counter()
        added = await in_flight(spans, client.add_span, concurrency)
        out[str(concurrency)] = time.perf_counter() - start
        if sum(a is not None for a in added) != len(spans):
            raise RuntimeError(f"add_span accepted {sum(a is not None for a in added)} of {len(spans)} spans")
        got = await held(rollout.rollout_id)
        if got != len(spans):
            raise RuntimeError(f"the store holds {got} of {len(spans)} spans added with {concurrency} in flight")
    return out


async def otlp_run(client: Any, store: Any, endpoint: str, cfg: dict[str, Any]) -> dict[str, float]:
    """otlp_n spans through BatchSpanProcessor + OTLPSpanExporter (protobuf over HTTP) to `endpoint`."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    n = cfg["otlp_n"]
    rollout = await client.start_rollout(input={"task": "otlp"}, mode="train")
    processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), max_queue_size=n,
                                   max_export_batch_size=cfg["otlp_batch"])
    provider, tracer = otel_tracer({"service.name": "litstream-agent",
                                    "agentlightning.rollout_id": rollout.rollout_id,
                                    "agentlightning.attempt_id": rollout.attempt.attempt_id}, processor)
    try:
        gc.collect()
        start = time.perf_counter()
        for i in range(n):
            make_span(tracer, cfg["variants"], i)
        ended = time.perf_counter()
        if not await asyncio.to_thread(provider.force_flush, 120_000):
            raise RuntimeError("force_flush of the OTLP exporter timed out")
        flushed = time.perf_counter()
    finally:
        provider.shutdown()
    held = len(await store.query_spans(rollout.rollout_id))
    if held != n:
        raise RuntimeError(f"the server's store holds {held} of {n} spans sent over OTLP")
    return {"end_s": ended - start, "flush_s": flushed - start}


async def add_otel_span_run(cfg: dict[str, Any]) -> dict[str, float]:
    """sdk_n spans made by an opentelemetry-sdk tracer, each handed to InMemoryLightningStore.add_otel_span as it
    ends: the in-process counterpart of an SDK span processor."""
    from agentlightning.store.memory import InMemoryLightningStore
    from opentelemetry.sdk.trace import SpanProcessor

    n = cfg["sdk_n"]
    store = InMemoryLightningStore()
    rollout = await store.start_rollout(input={"task": "sdk"}, mode="train")
    provider, tracer = otel_tracer({"service.name": "litstream-agent"}, SpanProcessor())
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
    end_s = 0.0
    gc.collect()
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        span = make_span(tracer, cfg["variants"], i)
        end_s += time.perf_counter() - t
        await store.add_otel_span(rid, aid, span)
    total_s = time.perf_counter() - start
    provider.shutdown()
    held = len(await store.query_spans(rid))
    if held != n:
        raise RuntimeError(f"the store holds {held} of {n} spans added with add_otel_span")
    return {"end_s": end_s, "total_s": total_s}


async def span_ingest(cfg: dict[str, Any]) -> dict[str, Any]:
    from agentlightning.store.client_server import LightningStoreClient, LightningStoreServer
    from agentlightning.store.memory import InMemoryLightningStore

    out: dict[str, Any] = {**versions(), "opentelemetry_sdk": version("opentelemetry-sdk"),
                           "otlp_exporter": version("opentelemetry-exporter-otlp-proto-http")}
    if cfg.get("url"):  # the stock client against another server (a litstream gateway)
        client = LightningStoreClient(cfg["url"], retry_delays=(0.5,), health_retry_delays=(0.1,))
        try:
            async def held_remote(rid: str) -> int:
                return len(await client.query_spans(rid))

            out["rest"] = await rest_rows(client, cfg, held_remote)
        finally:
            await client.close()
        return out
    store = InMemoryLightningStore()
    server = LightningStoreServer(store, host="127.0.0.1", port=free_port(), launch_mode="thread")
    await server.start()
    client = LightningStoreClient(server.endpoint, retry_delays=(0.5,), health_retry_delays=(0.1,))
    try:
        async def held_local(rid: str) -> int:
            return len(await store.query_spans(rid))

        out["rest"] = await rest_rows(client, cfg, held_local)
        out["otlp"] = await otlp_run(client, store, f"{server.endpoint}/v1/traces", cfg)
    finally:
        await client.close()
        await server.stop()
    out["add_otel_span"] = await add_otel_span_run(cfg)
    return out


async def adapter(cfg: dict[str, Any]) -> dict[str, Any]:
    """TracerTraceToTriplet over traces given as span dicts (span_id, parent_id, name, start/end ns,
    attributes); spans built first, only adapt() is timed."""
    from agentlightning.adapter.triplet import TracerTraceToTriplet
    from agentlightning.types import OtelResource, Span, SpanContext, TraceStatus

    traces = []
    for t in cfg["traces"]:
        trace_id = secrets.token_hex(16)
        traces.append([Span(
            rollout_id="ro-bench", attempt_id="at-bench", sequence_id=k + 1, trace_id=trace_id, span_id=s["span_id"],
            parent_id=s["parent_id"], name=s["name"], status=TraceStatus(status_code="OK"),
            attributes=s["attributes"], events=[], links=[], start_time=s["start"] / 1e9, end_time=s["end"] / 1e9,
            context=SpanContext(trace_id=trace_id, span_id=s["span_id"], is_remote=False, trace_state={}),
            parent=None, resource=OtelResource(attributes={}, schema_url=""),
        ) for k, s in enumerate(t)])
    adapter_ = TracerTraceToTriplet()
    samples, triplets = [], 0
    for _ in range(cfg["repeats"]):
        gc.collect()
        start = time.perf_counter()
        triplets = sum(len(adapter_.adapt(t)) for t in traces)
        samples.append(time.perf_counter() - start)
    return {**versions(), "traces": len(traces), "triplets": triplets, "samples_s": samples}


REFERENCE_SERVER = """
import sys
from agentlightning.store.client_server import LightningStoreServer
from agentlightning.store.memory import InMemoryLightningStore
import asyncio

async def main(port):
    server = LightningStoreServer(InMemoryLightningStore(), host="127.0.0.1", port=port, launch_mode="asyncio")
    await server.start()
    await asyncio.Event().wait()

asyncio.run(main(int(sys.argv[1])))
"""


def reference_server() -> tuple[Any, str]:
    """A LightningStoreServer over InMemoryLightningStore in a process of its own; (process, url) once it answers."""
    import subprocess
    import urllib.request

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", REFERENCE_SERVER, str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the reference server exited with code {proc.returncode}")
        try:
            urllib.request.urlopen(url + "/v1/agl/health", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the reference server did not answer within 120 s")


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {"n": len(ordered), "p50_ms": at(0.5), "p90_ms": at(0.9), "p99_ms": at(0.99)}


async def agent_loop_run(url: str, cfg: dict[str, Any], workers: int) -> dict[str, Any]:
    """`n` rollouts through the agent loop from `workers` concurrent agents; wall time and per-call latencies."""
    from agentlightning.store.client_server import LightningStoreClient

    calls: dict[str, list[float]] = {k: [] for k in ("enqueue_rollout", "dequeue_rollout", "get_next_span_sequence_id",
                                                     "add_span", "update_attempt", "wait_for_rollouts")}
    left = {"to_enqueue": cfg["n"], "empty": 0}
    ids: list[str] = []

    async def timed(kind: str, call: Any) -> Any:
        start = time.perf_counter()
        result = await call
        calls[kind].append(time.perf_counter() - start)
        return result

    async def agent(i: int) -> None:
        client = LightningStoreClient(url, retry_delays=(0.5,), health_retry_delays=(0.1,))
        try:
            while left["to_enqueue"] > 0:
                left["to_enqueue"] -= 1
                rollout = await timed("enqueue_rollout", client.enqueue_rollout(input={"task": i}, mode="train"))
                ids.append(rollout.rollout_id)
                claimed = None
                while claimed is None:
                    claimed = await timed("dequeue_rollout", client.dequeue_rollout(worker_id=f"agent-{i}"))
                    if claimed is None:
                        left["empty"] += 1
                        await asyncio.sleep(cfg.get("empty_sleep_s", 0.01))
                rid, aid = claimed.rollout_id, claimed.attempt.attempt_id
                for span in build_spans({"variants": cfg["variants"], "spans_per_rollout": cfg["spans"]},
                                        [(rid, aid)]):
                    seq = await timed("get_next_span_sequence_id", client.get_next_span_sequence_id(rid, aid))
                    await timed("add_span", client.add_span(span.model_copy(update={"sequence_id": seq})))
                await timed("update_attempt", client.update_attempt(rid, aid, status="succeeded"))
        finally:
            await client.close()

    start = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(workers)))
    client = LightningStoreClient(url, retry_delays=(0.5,), health_retry_delays=(0.1,))
    try:  # the stock client refuses a wait over 0.1 s: it polls, as a trainer using it does
        deadline = time.monotonic() + 60
        done = await timed("wait_for_rollouts", client.wait_for_rollouts(rollout_ids=ids, timeout=0))
        while len(done) < len(ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            done = await timed("wait_for_rollouts", client.wait_for_rollouts(rollout_ids=ids, timeout=0))
    finally:
        await client.close()
    wall = time.perf_counter() - start
    succeeded = sum(1 for r in done if r.status == "succeeded")
    if succeeded != cfg["n"]:
        raise RuntimeError(f"{succeeded} of {cfg['n']} rollouts succeeded with {workers} agents")
    return {"wall_s": wall, "rollouts": succeeded, "empty_dequeues": left["empty"],
            "calls": {k: percentiles(v) for k, v in calls.items() if v}, "ids": ids[-cfg.get("queries", 50):]}


async def query_timings(url: str, ids: list[str]) -> dict[str, Any]:
    """get_rollout_by_id and query_spans of finished rollouts, one after the other, as an algorithm reads each
    rollout it trains on: p50/p90/p99 of each (ms)."""
    from agentlightning.store.client_server import LightningStoreClient

    calls: dict[str, list[float]] = {"get_rollout_by_id": [], "query_spans": []}
    client = LightningStoreClient(url, retry_delays=(0.5,), health_retry_delays=(0.1,))
    try:
        for rid in ids:
            start = time.perf_counter()
            await client.get_rollout_by_id(rid)
            calls["get_rollout_by_id"].append(time.perf_counter() - start)
            start = time.perf_counter()
            await client.query_spans(rid)
            calls["query_spans"].append(time.perf_counter() - start)
    finally:
        await client.close()
    return {k: percentiles(v) for k, v in calls.items()}


async def page_timings(url: str, rollouts: int, repeats: int = 10) -> dict[str, Any]:
    """query_rollouts pages of 100 sorted by start time (the newest first), at the start of the list and in its
    middle, ``repeats`` times each: p50/p90/p99 (ms) and the total the page reported."""
    from agentlightning.store.client_server import LightningStoreClient

    calls: dict[str, list[float]] = {"query_rollouts newest 100": [], "query_rollouts 100 in the middle": []}
    totals: dict[str, int] = {}
    client = LightningStoreClient(url, retry_delays=(0.5,), health_retry_delays=(0.1,))
    try:
        for _ in range(repeats):
            for name, offset in zip(calls, (0, rollouts // 2)):
                start = time.perf_counter()
                page = await client.query_rollouts(sort_by="start_time", sort_order="desc", limit=100, offset=offset)
                calls[name].append(time.perf_counter() - start)
                totals[name] = page.total
    finally:
        await client.close()
    return {k: {**percentiles(v), "total": totals[k]} for k, v in calls.items()}


def tree_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) spent so far by these processes and every descendant still running (read from
    /proc: a process's own times, its threads included)."""
    stats = _proc_stats()
    seen = _tree(pids, stats)
    return sum(cpu for pid, _, cpu in stats if pid in seen) / _clock_ticks()


JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")  # HotSpot's compiler threads, as /proc shortens their names


def jit_cpu_s(pids: list[int]) -> float:
    """CPU seconds spent so far by the JIT compiler threads of these processes and their descendants: the warm-up
    of a fresh JVM (the broker's), which a long-running one has behind it."""
    from pathlib import Path

    ticks = 0
    for pid in _tree(pids, _proc_stats()):
        for path in Path(f"/proc/{pid}/task").glob("[0-9]*/stat"):
            try:
                text = path.read_text()
            except OSError:
                continue
            if text[text.index("(") + 1:text.rindex(")")].startswith(JIT_THREADS):
                ticks += _cpu_ticks(_stat_fields(text))
    return ticks / _clock_ticks()


def _tree(pids: list[int], stats: list[tuple[int, int, int]]) -> set[int]:
    """These processes and their descendants, from ``_proc_stats``'s parent links."""
    children: dict[int, list[int]] = {}
    for pid, parent, _ in stats:
        children.setdefault(parent, []).append(pid)
    seen: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += children.get(pid, [])
    return seen


def _proc_stats() -> list[tuple[int, int, int]]:
    """(pid, parent pid, utime + stime in clock ticks) of every process."""
    from pathlib import Path

    out = []
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = path.read_text()
        except OSError:  # gone meanwhile
            continue
        fields = _stat_fields(text)
        out.append((int(path.parent.name), int(fields[1]), _cpu_ticks(fields)))
    return out


def _stat_fields(text: str) -> list[str]:
    """The fields of a /proc stat line after the command name (which may hold spaces), the state first."""
    return text[text.rindex(")") + 2:].split()


def _cpu_ticks(fields: list[str]) -> int:
    """utime + stime, in clock ticks, of :func:`_stat_fields`."""
    return int(fields[11]) + int(fields[12])


def _clock_ticks() -> int:
    import os

    return os.sysconf("SC_CLK_TCK")


async def agent_loop(cfg: dict[str, Any]) -> dict[str, Any]:
    proc, url = (None, cfg["url"]) if cfg.get("url") else reference_server()
    cpu_pids: dict[str, list[int]] = cfg.get("cpu_pids") or ({"server": [proc.pid]} if proc is not None else {})
    try:
        if cfg.get("warmup"):  # untimed: the same loop warms the server (the broker's JIT, caches) on both sides
            await agent_loop_run(url, {**cfg, "n": cfg["warmup"]}, max(cfg["workers"]))
        runs = {}
        for w in cfg["workers"]:
            before = {group: tree_cpu_s(pids) for group, pids in cpu_pids.items()}
            jit_before = {group: jit_cpu_s(pids) for group, pids in cpu_pids.items()}
            run = await agent_loop_run(url, cfg, w)
            run["cpu_ms_per_rollout"] = {group: (tree_cpu_s(pids) - before[group]) * 1000 / run["rollouts"]
                                         for group, pids in cpu_pids.items()}
            for group, pids in cpu_pids.items():  # a JVM's JIT compiler threads, counted above, also apart
                if (jit := jit_cpu_s(pids) - jit_before[group]) > 0:
                    run["cpu_ms_per_rollout"][f"{group} jit"] = jit * 1000 / run["rollouts"]
            run["calls"].update(await query_timings(url, run.pop("ids")))  # after the CPU count: reads, not the loop
            runs[str(w)] = run
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
    return {**versions(), "runs": runs}


def tree_rss_mib(pids: list[int]) -> float:
    """Resident memory (MiB) of these processes and every descendant still running, summed (from /proc)."""
    from pathlib import Path

    seen = _tree(pids, _proc_stats())
    total_kib = 0
    for pid in seen:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total_kib += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total_kib / 1024


async def growth(cfg: dict[str, Any]) -> dict[str, Any]:
    """``n`` rollouts of the agent loop at ``agents`` agents in four quarters against one server: each quarter's
    rate and the resident memory of each process group after it; the reads' latencies after the first and the
    last quarter. Progress on stderr."""
    proc, url = (None, cfg["url"]) if cfg.get("url") else reference_server()
    groups: dict[str, list[int]] = cfg.get("rss_pids") or ({"server": [proc.pid]} if proc is not None else {})
    quarters: list[dict[str, Any]] = []
    first_ids: list[str] = []
    try:
        for q in range(4):
            run = await agent_loop_run(url, {**cfg, "n": cfg["n"] // 4}, cfg["agents"])
            entry: dict[str, Any] = {"rollouts": run["rollouts"], "wall_s": run["wall_s"],
                                     "rss_mib": {name: tree_rss_mib(pids) for name, pids in groups.items()}}
            if q in (0, 3):
                entry["reads"] = await query_timings(url, run["ids"])
                entry["pages"] = await page_timings(url, sum(x["rollouts"] for x in quarters) + run["rollouts"])
            if q == 0:
                first_ids = run["ids"]
            if q == 3:  # the first quarter's rollouts, read again at the end (finished long ago)
                entry["first_quarter_reads"] = await query_timings(url, first_ids)
            quarters.append(entry)
            sys.stderr.write(f"  quarter {q + 1}/4: {run['rollouts'] / run['wall_s']:.1f} rollouts/s, RSS "
                             + ", ".join(f"{k} {v:,.0f} MiB" for k, v in entry["rss_mib"].items()) + "\n")
            sys.stderr.flush()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
    return {**versions(), "quarters": quarters}


MODES = {"spans": bench, "rollout_cycles": rollout_cycles, "timer_latency": timer_latency, "apply_ops": apply_ops,
         "span_ingest": span_ingest, "adapter": adapter,
         "agent_loop": agent_loop, "growth": growth}


def main() -> None:
    cfg = json.load(sys.stdin)
    result = asyncio.run(MODES[cfg.get("mode", "spans")](cfg))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
