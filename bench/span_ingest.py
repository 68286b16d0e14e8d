"""span_ingest: spans/s into litstream through its three ingest paths, beside Agent Lightning 0.3.0's own server.

litstream: an embedded broker, the lifecycle processor, the span sink and the gateway as processes of their own.
1. SDK exporter: an opentelemetry-sdk TracerProvider with KafkaSpanProcessor in this process, resource attributes
   carrying the ids of a rollout started with LitStore.start_rollout; N spans ended from one thread, then
   force_flush(); then polled in ClickHouse until all N are there.
2. OTLP/HTTP: opentelemetry-exporter-otlp-proto-http's OTLPSpanExporter behind a BatchSpanProcessor, pointed at the
   gateway's /v1/traces, the same spans.
3. REST: Agent Lightning's stock LightningStoreClient (in its own virtualenv) calling add_span against the
   gateway's /v1/agl, with 1 and 16 calls in flight.

Agent Lightning 0.3.0: LightningStoreServer(InMemoryLightningStore()) in thread launch mode, the same client and
the same OTLP exporter against it, and in-process add_otel_span as the closest counterpart of row 1.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import asdict, dataclass
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from litstream.app.stack import Stack
from litstream.infra import clickhouse
from litstream.infra.broker import free_port
from litstream.infra.settings import Settings
from litstream.workers.otel import KafkaSpanProcessor
from litstream.workers.store import LitStore

from .agl_reference import make_span, otel_tracer
from .harness import Context, Report, Row, rate_row
from .kafka_codec import span_variants
from .lifecycle import AGL, agl_baseline, broker_settings, rate

TITLE = ("spans/s into litstream (SDK exporter to Kafka, OTLP/HTTP, REST add_span), with Agent Lightning 0.3.0's "
         "server")


@dataclass(frozen=True)
class Sizes:
    sdk_n: int  # spans through the SDK exporter (KafkaSpanProcessor)
    otlp_n: int  # spans through the OTLP/HTTP exporter
    rest_n: int  # spans through add_span, per concurrency
    otlp_batch: int = 512  # BatchSpanProcessor's max_export_batch_size
    concurrencies: tuple[int, ...] = (1, 16)
    visible_timeout_s: float = 120.0


FULL = Sizes(sdk_n=20_000, otlp_n=20_000, rest_n=3_000)
QUICK = Sizes(sdk_n=2_000, otlp_n=2_000, rest_n=300)


def _resource(rollout: Any) -> dict[str, Any]:
    return {"service.name": "litstream-agent", "agentlightning.rollout_id": rollout.rollout_id,
            "agentlightning.attempt_id": rollout.attempt.attempt_id}


def _visible(settings: Settings, rollout_id: str, n: int, start: float, timeout_s: float) -> float:
    """Seconds from `start` until ClickHouse holds n spans of the rollout (polled every 50 ms)."""
    sql = f"SELECT count() FROM spans FINAL WHERE rollout_id = '{rollout_id}'"
    deadline = time.monotonic() + timeout_s
    got = 0
    while time.monotonic() < deadline:
        got = int(clickhouse.query(settings.resolved_clickhouse_dsn, sql).rows[0][0])
        if got >= n:
            if got != n:
                raise RuntimeError(f"ClickHouse holds {got} spans of {rollout_id}, expected {n}")
            return time.perf_counter() - start
        time.sleep(0.05)
    raise RuntimeError(f"ClickHouse holds {got} of {n} spans of {rollout_id} after {timeout_s:.0f}s")


def sdk_run(settings: Settings, rollout: Any, variants: list[dict[str, Any]], n: int,
            timeout_s: float) -> dict[str, Any]:
    """n spans ended through KafkaSpanProcessor (queue sized to hold them all), force_flush, visible."""
    processor = KafkaSpanProcessor(settings=settings, max_queue_size=n + 1)
    provider, tracer = otel_tracer(_resource(rollout), processor)
    try:
        make_span(tracer, variants, -1)  # warm-up: the producer connects and gets its id before the clock
        if not processor.force_flush():
            raise RuntimeError("the warm-up span was not flushed")
        gc.collect()
        start = time.perf_counter()
        for i in range(n):
            make_span(tracer, variants, i)
        ended = time.perf_counter()
        if not processor.force_flush(120_000):
            raise RuntimeError("KafkaSpanProcessor.force_flush timed out")
        flushed = time.perf_counter()
        stats = processor.stats()
    finally:
        provider.shutdown()
    if stats["sent"] != n + 1 or stats["dropped_queue_full"] or stats["dropped_invalid"] or stats["dropped_no_ids"]:
        raise RuntimeError(f"KafkaSpanProcessor did not send every span: {stats}")
    visible = _visible(settings, rollout.rollout_id, n + 1, start, timeout_s)
    return {"end_s": ended - start, "flush_s": flushed - start, "visible_s": visible, "stats": stats}


def otlp_run(settings: Settings, url: str, rollout: Any, variants: list[dict[str, Any]], n: int, batch: int,
             timeout_s: float) -> dict[str, Any]:
    """n spans through BatchSpanProcessor + OTLPSpanExporter (protobuf) to the gateway, force_flush, visible."""
    processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{url}/v1/traces"), max_queue_size=n + 1,
                                   max_export_batch_size=batch)
    provider, tracer = otel_tracer(_resource(rollout), processor)
    try:
        make_span(tracer, variants, -1)  # warm-up: the HTTP connection is open before the clock
        if not provider.force_flush():
            raise RuntimeError("the warm-up span was not exported")
        gc.collect()
        start = time.perf_counter()
        for i in range(n):
            make_span(tracer, variants, i)
        ended = time.perf_counter()
        if not provider.force_flush(120_000):
            raise RuntimeError("force_flush of the OTLP exporter timed out")
        flushed = time.perf_counter()
    finally:
        provider.shutdown()
    visible = _visible(settings, rollout.rollout_id, n + 1, start, timeout_s)
    return {"end_s": ended - start, "flush_s": flushed - start, "visible_s": visible}


async def start_rollouts(settings: Settings, k: int) -> list[Any]:
    store = LitStore(settings)
    try:
        await store.wait_until_ready()
        return [await store.start_rollout(input={"task": f"span-ingest-{i}"}, mode="train") for i in range(k)]
    finally:
        await store.close()


def _rest_config(sizes: Sizes, variants: list[dict[str, Any]], url: str | None) -> dict[str, Any]:
    return {"mode": "span_ingest", "variants": variants, "url": url, "rest_n": sizes.rest_n,
            "concurrencies": list(sizes.concurrencies), "otlp_n": sizes.otlp_n, "otlp_batch": sizes.otlp_batch,
            "sdk_n": sizes.sdk_n}


def _rest_rows(prefix: str, sizes: Sizes, rest: dict[str, float], note: str) -> list[Row]:
    return [rate_row(f"{prefix}, {k} in flight", [rest[str(k)]], sizes.rest_n, note=note)
            for k in sizes.concurrencies]


def _rest_labels(prefix: str, sizes: Sizes) -> list[str]:
    return [f"{prefix}, {k} in flight" for k in sizes.concurrencies]


LIT_REST = "litstream REST add_span (stock LightningStoreClient -> gateway /v1/agl)"
AGL_REST = f"{AGL} server REST add_span (same client)"
AGL_OTLP = f"{AGL} server OTLP/HTTP /v1/traces: force_flush returned"
AGL_SDK = f"{AGL} InMemory add_otel_span (in-process)"


def litstream_part(ctx: Context, sizes: Sizes, variants: list[dict[str, Any]]) -> tuple[list[Row], dict[str, Any]]:
    with broker_settings(ctx, "span_ingest") as settings, Stack(settings) as stack:
        ctx.step("starting the lifecycle processor, the span sink and the gateway")
        url = stack.start_store(free_port())
        sdk_rollout, otlp_rollout = asyncio.run(start_rollouts(settings, 2))
        ctx.step(f"litstream: {sizes.sdk_n} spans through KafkaSpanProcessor")
        sdk = sdk_run(settings, sdk_rollout, variants, sizes.sdk_n, sizes.visible_timeout_s)
        ctx.step(f"litstream: {sizes.otlp_n} spans through the OTLP/HTTP exporter to the gateway")
        otlp = otlp_run(settings, url, otlp_rollout, variants, sizes.otlp_n, sizes.otlp_batch,
                        sizes.visible_timeout_s)
        rest, missing = agl_baseline(ctx, _rest_config(sizes, variants, url), _rest_labels(LIT_REST, sizes))
    n_sdk, n_otlp = sizes.sdk_n, sizes.otlp_n
    rows = [
        rate_row("litstream SDK exporter (KafkaSpanProcessor): span end", [sdk["end_s"]], n_sdk,
                 note="the agent-side cost: start_span + add_event + end, one thread; the processor's thread "
                      "encodes and produces meanwhile"),
        rate_row("litstream SDK exporter: durable on Kafka (incl. force_flush)", [sdk["flush_s"]], n_sdk,
                 note="until force_flush returned: every span produced, acks=all"),
        rate_row("litstream SDK exporter: visible in ClickHouse", [sdk["visible_s"]], n_sdk,
                 note="THE END-TO-END FIGURE: SDK produce -> Kafka -> span sink (Arrow insert) -> visible in SQL; "
                      "until count() FROM spans FINAL reached N (polled every 50 ms)"),
        rate_row("litstream OTLP/HTTP exporter -> gateway /v1/traces: force_flush returned", [otlp["flush_s"]],
                 n_otlp, note=f"BatchSpanProcessor(max_export_batch_size={sizes.otlp_batch}), protobuf; span end "
                              f"{rate(n_otlp, otlp['end_s'])}; every 200 means written to Kafka"),
        rate_row("litstream OTLP/HTTP: visible in ClickHouse", [otlp["visible_s"]], n_otlp,
                 note="until count() FROM spans FINAL reached N"),
    ]
    if rest is None:
        rows += [Row(label, note="skipped (--no-agl: the stock client lives in the Agent Lightning venv)")
                 for label in _rest_labels(LIT_REST, sizes)] if not ctx.agl else missing
    else:
        rows += _rest_rows(LIT_REST, sizes, rest["rest"], "each call returns once the span is on Kafka; "
                                                          "all N read back with query_spans")
    return rows, {"litstream_s": {"sdk": sdk, "otlp": otlp, "rest": rest["rest"] if rest else None}}


def agl_part(ctx: Context, sizes: Sizes, variants: list[dict[str, Any]]) -> tuple[list[Row], dict[str, Any]]:
    labels = [*_rest_labels(AGL_REST, sizes), AGL_OTLP, AGL_SDK]
    result, missing = agl_baseline(ctx, _rest_config(sizes, variants, None), labels)
    if result is None:
        return missing, {}
    otlp, sdk = result["otlp"], result["add_otel_span"]
    rows = _rest_rows(AGL_REST, sizes, result["rest"],
                      "LightningStoreServer(InMemoryLightningStore()), thread launch mode, in the client's process")
    rows.append(rate_row(AGL_OTLP, [otlp["flush_s"]], sizes.otlp_n,
                         note=f"same exporter ({result['otlp_exporter']}) and batch; span end "
                              f"{rate(sizes.otlp_n, otlp['end_s'])}; held in memory, nothing durable"))
    rows.append(rate_row(AGL_SDK, [sdk["total_s"]], sizes.sdk_n,
                         note="closest counterpart of the SDK exporter rows (it has no exporter to a log): each "
                              f"span handed to add_otel_span as it ends; span end alone {rate(sizes.sdk_n, sdk['end_s'])}"
                              "; nothing durable"))
    return rows, {"agl": result}


def run(ctx: Context) -> Report:
    sizes = QUICK if ctx.quick else FULL
    variants = span_variants()
    rows, params = litstream_part(ctx, sizes, variants)
    more, extra = agl_part(ctx, sizes, variants)
    return Report(rows + more, {**asdict(sizes), **params, **extra, "rate": "spans/s"})
