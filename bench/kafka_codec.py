"""kafka_codec: what one Python process pushes through the Avro codec, the broker and EventProducer.send.

1. the codec alone (Codec(), single-object encoding): encode and decode of SpanRecorded and RolloutEnqueued;
2. the broker alone: pre-encoded span values produced through the embedded broker (Apache Kafka, 4 partitions)
   with the project's producer settings, flushed, then read back to the end;
3. EventProducer.send (encode + produce + flush) of the same span events;
4. for reference, Agent Lightning 0.3.0's InMemoryLightningStore with the same span contents (add_span one by
   one, add_many_spans in batches), run in its own virtualenv.

Events are built before timing starts: the rows measure the codec and the clients, not pydantic construction.
"""

from __future__ import annotations

import gc
import io
import random
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import fastavro
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from litstream.infra.broker import KafkaBroker
from litstream.infra.kafka import consumer, create_topics, flush_or_raise, producer, read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec
from litstream.schemas.events import (
    BY_NAME,
    AttemptHeartbeat,
    AttemptSnapshot,
    AttemptStarted,
    AttemptStatusChanged,
    AttemptUpdated,
    AvroModel,
    AvroRolloutConfig,
    EventFactory,
    NamedResourceRecord,
    ResourceRecord,
    ResourcesPublished,
    RolloutEnqueued,
    RolloutOffered,
    RolloutSnapshot,
    RolloutStatusChanged,
    RolloutUpdated,
    SequenceRequested,
    SpanEventRecord,
    SpanRecorded,
    TrainedSample,
    TripletEmitted,
    VersionTrained,
    WorkerObserved,
)
from litstream.schemas.models import new_attempt_id, new_resources_id, new_rollout_id

from .harness import (
    AGL_REQUIREMENT,
    Context,
    Report,
    Row,
    cpu_timed,
    rate_row,
    repeat,
    run_agl_reference,
    timed,
)

TITLE = "codec, broker and EventProducer rates, with Agent Lightning 0.3.0's in-memory store for reference"
PARTITIONS = 4
ROLLOUTS = 50  # spans are spread over this many rollouts (keys), as from a batch of concurrent agents
VARIANTS = 16  # distinct span contents, cycled; ids and times are unique per span


@dataclass(frozen=True)
class Sizes:
    spans: int
    enqueued: int
    repeats: int
    broker_repeats: int  # the broker rows are noisier (three processes' threads on few cores): more repeats
    broker_copies: int  # the raw broker rows send the spans this many times: 20k take ~0.1 s, too short
    agl_rollouts: int
    agl_spans_per_rollout: int
    agl_batch: int
    per_type: int  # records of each type in the every-type rows


# Full: ~0.3-1 s per timed repeat, so that every row's repeats together stay well inside 2 minutes.
FULL = Sizes(spans=20_000, enqueued=20_000, repeats=3, broker_repeats=5, broker_copies=3, agl_rollouts=50,
             agl_spans_per_rollout=100, agl_batch=50, per_type=5_000)
QUICK = Sizes(spans=500, enqueued=500, repeats=1, broker_repeats=1, broker_copies=1, agl_rollouts=5,
              agl_spans_per_rollout=50, agl_batch=50, per_type=200)

_WORDS = ("the a of to and in is that it for on with as was at by be this from or an are not have which "
          "number total each apples cost dollars left after more than twice half per day week she he they "
          "buys sells gives has had how many much price step first then so answer therefore compute").split()


def _text(rng: random.Random, nbytes: int) -> str:
    words: list[str] = []
    size = 0
    while size < nbytes:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def span_variants(n: int = VARIANTS, seed: int = 7) -> list[dict[str, Any]]:
    """LLM-call spans as an instrumented OpenAI client records them (gen_ai.* conventions), as plain JSON, so
    the Agent Lightning script builds spans with the very same contents."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        attributes: dict[str, Any] = {
            "gen_ai.system": "openai",
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "Qwen/Qwen2.5-1.5B-Instruct",
            "gen_ai.response.model": "Qwen/Qwen2.5-1.5B-Instruct",
            "gen_ai.request.temperature": 0.7,
            "gen_ai.request.top_p": 0.95,
            "gen_ai.request.max_tokens": 512,
            "gen_ai.response.id": f"chatcmpl-{rng.getrandbits(96):024x}",
            "gen_ai.response.finish_reasons": ["stop"],
            "gen_ai.usage.input_tokens": rng.randint(120, 400),
            "gen_ai.usage.output_tokens": rng.randint(40, 200),
            "gen_ai.prompt.0.role": "system",
            "gen_ai.prompt.0.content": "You are a careful math tutor. Think step by step and write the final "
                                       "answer after '####'.",
            "gen_ai.prompt.1.role": "user",
            "gen_ai.prompt.1.content": _text(rng, rng.randint(200, 400)),
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": _text(rng, rng.randint(250, 500)),
        }
        duration_ns = rng.randint(200_000_000, 3_000_000_000)
        events = [{"name": "gen_ai.content.prompt", "offset_ns": 1_000_000,
                   "attributes": {"gen_ai.prompt": _text(rng, 80)}}]
        if i % 2:
            events.append({"name": "gen_ai.choice", "offset_ns": duration_ns - 1_000,
                           "attributes": {"index": 0, "finish_reason": "stop"}})
        out.append({"name": "openai.chat.completion", "duration_ns": duration_ns, "attributes": attributes,
                    "events": events, "resource": {"service.name": "litstream-agent"}})
    return out


def build_spans(n: int, variants: list[dict[str, Any]], factory: EventFactory) -> list[SpanRecorded]:
    """n SpanRecorded events, round-robin over ROLLOUTS rollouts (so over every partition)."""
    rollouts = [(new_rollout_id(), new_attempt_id(), secrets.token_hex(16), secrets.token_hex(8))
                for _ in range(ROLLOUTS)]
    now_ns = time.time_ns()
    spans = []
    for i in range(n):
        v = variants[i % len(variants)]
        rollout_id, attempt_id, trace_id, root_id = rollouts[i % ROLLOUTS]
        start_ns = now_ns + i * 1000
        spans.append(SpanRecorded(
            meta=factory.meta(rollout_id), attempt_id=attempt_id, sequence_id=i // ROLLOUTS + 1,
            trace_id=trace_id, span_id=secrets.token_hex(8), parent_id=root_id, name=v["name"], kind="CLIENT",
            status_code="OK", start_time_ns=start_ns, end_time_ns=start_ns + v["duration_ns"],
            attributes=v["attributes"],
            events=[SpanEventRecord(name=e["name"], timestamp_ns=start_ns + e["offset_ns"],
                                    attributes=e["attributes"]) for e in v["events"]],
            resource=ResourceRecord(attributes={**v["resource"], "agentlightning.rollout_id": rollout_id,
                                                "agentlightning.attempt_id": attempt_id}),
            scope_name="litstream.sdk", scope_version="0.1.0",
        ))
    return spans


def build_enqueued(n: int, factory: EventFactory, seed: int = 11) -> list[RolloutEnqueued]:
    """Rollouts of a GSM8K-like task: a few hundred bytes of question, a retry policy, some metadata."""
    rng = random.Random(seed)
    resources_id = new_resources_id()
    config = AvroRolloutConfig(timeout_seconds=300.0, unresponsive_seconds=60.0, max_attempts=3,
                               retry_condition=["timeout", "unresponsive"])
    questions = [_text(rng, rng.randint(150, 350)) for _ in range(VARIANTS)]
    return [RolloutEnqueued(
        meta=factory.meta(new_rollout_id()),
        input={"id": f"gsm8k-train-{i}", "question": questions[i % VARIANTS],
               "answer": str(rng.randint(1, 999))},
        start_time=time.time(), mode="train", resources_id=resources_id, config=config,
        metadata={"dataset": "gsm8k", "epoch": 1, "group_id": f"g-{i // 8}"},
    ) for i in range(n)]


def build_other_types(n: int, factory: EventFactory, enqueued: RolloutEnqueued) -> dict[str, list[AvroModel]]:
    """n records of each type besides spans and enqueues, with the contents the pipeline gives them: a triplet of
    a few hundred tokens, a snapshot with its attempt, a resources update naming an LLM."""
    rng = random.Random(13)
    now = time.time()
    out: dict[str, list[AvroModel]] = {}
    for i in range(n):
        rid, aid = new_rollout_id(), new_attempt_id()
        meta = factory.meta(rid)
        records: list[AvroModel] = [
            RolloutStatusChanged(meta=meta, status="running", time=now),
            AttemptStarted(meta=meta, attempt_id=aid, sequence_id=1, start_time=now, worker_id="runner-3"),
            AttemptHeartbeat(meta=meta, attempt_id=aid, time=now, worker_id="runner-3", max_sequence_id=i % 10),
            AttemptStatusChanged(meta=meta, attempt_id=aid, status="succeeded", time=now, worker_id="runner-3"),
            RolloutUpdated(meta=meta, time=now, set_fields=["metadata"], metadata={"reward": 1.0, "note": "ok"}),
            AttemptUpdated(meta=meta, attempt_id=aid, time=now, set_fields=["status"], status="running"),
            SequenceRequested(meta=meta, attempt_id=aid, count=1),
            ResourcesPublished(**factory.stamp(), resources_id=f"rs-{i}", version=i + 1, create_time=now,
                               update_time=now, resources={"main_llm": NamedResourceRecord(
                                   resource_type="llm", endpoint="http://127.0.0.1:8000/v1", model="policy",
                                   sampling_parameters={"temperature": 0.7, "top_p": 0.95}, version=i + 1)}),
            TripletEmitted(meta=meta, attempt_id=aid, group_id=f"g-{i // 8}", index=i % 8, policy_version="v3",
                           prompt_token_ids=[rng.randrange(32_000) for _ in range(200)],
                           response_token_ids=[rng.randrange(32_000) for _ in range(120)],
                           response_logprobs=[-rng.random() for _ in range(120)],
                           prompt_text=enqueued.input["question"], response_text=_text(rng, 300), reward=1.0,
                           metadata={"dataset": "gsm8k"}),
            RolloutOffered(meta=meta, attempt_sequence=1, input=enqueued.input, mode="train",
                           resources_id=enqueued.resources_id, config=enqueued.config, metadata=enqueued.metadata),
            RolloutSnapshot(rollout_id=rid, version=4, input=enqueued.input, start_time=now, mode="train",
                            status="running", config=enqueued.config, metadata=enqueued.metadata,
                            attempts=[AttemptSnapshot(attempt_id=aid, sequence_id=1, start_time=now,
                                                      status="running", worker_id="runner-3",
                                                      last_heartbeat_time=now)],
                            updated_ns=time.time_ns(), last_event_id=meta.event_id,
                            last_producer_id=meta.producer_id, last_producer_seq=meta.producer_seq,
                            next_sequence_id=11),
            WorkerObserved(**factory.stamp(), worker_id="runner-3", time=now, kind="attempt", status="busy",
                           rollout_id=rid, attempt_id=aid),
            VersionTrained(**factory.stamp(), resources_id=f"policy-v{i + 1}", version=i + 1, time=now,
                           window="count", samples=[TrainedSample(rollout_id=new_rollout_id(), attempt_id=aid,
                                                                  group_id=f"g-{k // 8}", index=0, policy_version=i,
                                                                  reward=float(k % 2)) for k in range(64)]),
        ]
        for record in records:
            out.setdefault(type(record).avro_name, []).append(record)  # type: ignore[attr-defined]
    return out


def _bare_ways(records: list[AvroModel], codec: Codec) -> tuple[Callable[[], None], Callable[[], None]]:
    """Bare fastavro on the same records and schema: the Avro record (a dict) -> bytes -> a dict, what the codec is
    measured against (its own cost is the model on each side and the header). (encode all, decode all)."""
    schema = codec.writer_schema(type(records[0]).avro_name)  # type: ignore[attr-defined]
    dicts = [r.to_wire_record() for r in records]
    bodies = []
    for d in dicts:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, d)
        bodies.append(buf.getvalue())

    def encode_all() -> None:
        for d in dicts:
            fastavro.schemaless_writer(io.BytesIO(), schema, d)

    def decode_all() -> None:
        for body in bodies:
            fastavro.schemaless_reader(io.BytesIO(body), schema, None)

    return encode_all, decode_all


def fastavro_rates(records: list[AvroModel], codec: Codec, repeats: int) -> tuple[float, float]:
    """Bare fastavro's (encode, decode) rates on the records (:func:`_bare_ways`)."""
    encode_all, decode_all = _bare_ways(records, codec)
    return (len(records) / statistics.median(repeat(encode_all, repeats)),
            len(records) / statistics.median(repeat(decode_all, repeats)))


def fastavro_rows(label: str, records: list[AvroModel], codec: Codec, repeats: int) -> list[Row]:
    encode, decode = fastavro_rates(records, codec, repeats)
    return [Row(f"fastavro encode {label}", encode, n=len(records), note="bare schemaless_writer, same schema"),
            Row(f"fastavro decode {label}", decode, n=len(records), note="bare schemaless_reader, same schema")]


def every_type_rows(others: dict[str, list[AvroModel]], spans: list[SpanRecorded],
                    enqueued: list[RolloutEnqueued], codec: Codec, repeats: int) -> list[Row]:
    """The slowest record type's encode and decode rate, and the record type furthest from bare fastavro's rate
    on the same records (the codec's target, a ratio, holds for every type): its rate and fastavro's. Both ways
    of the codec: with models (model -> bytes -> model, what a caller that needs the model gets) and with records
    (record -> bytes -> record: the codec's own cost, what a path that only moves records on pays)."""
    by_type: dict[str, list[AvroModel]] = {**others, SpanRecorded.avro_name: list(spans),
                                           RolloutEnqueued.avro_name: list(enqueued)}
    missing = set(BY_NAME) - set(by_type)
    if missing:
        raise RuntimeError(f"no benchmark records of {sorted(missing)}")
    models: dict[str, tuple[float, float]] = {}
    records: dict[str, tuple[float, float]] = {}
    bare: dict[str, tuple[float, float]] = {}
    for name, of_type in by_type.items():
        models[name], records[name], bare[name] = _type_rates(name, of_type, codec, repeats)
    rows = []
    for i, verb in enumerate(("encode", "decode")):
        name, rate = min(((n, r[i]) for n, r in models.items()), key=lambda item: item[1])
        fastest = max(r[i] for r in models.values())
        rows.append(Row(f"codec {verb}, slowest of {len(models)} record types", rate, None, len(by_type[name]),
                        f"{name.removeprefix('litstream.')}; the fastest type {fastest:,.0f}/s"))
        for path, rates in (("", models), (" records", records)):
            rows += _furthest_rows(f"codec {verb}{path}", f"fastavro {verb}, the type furthest from the codec{path}",
                                   i, rates, bare, by_type)
    return rows


Rates = tuple[float, float]  # (encode, decode), records/s


def _type_rates(name: str, of_type: list[AvroModel], codec: Codec, repeats: int) -> tuple[Rates, Rates, Rates]:
    """(encode, decode) rates of one record type through the codec with models, with records, and through bare
    fastavro. Each repeat times all six back to back, so that a ratio compares timings taken seconds apart, not
    minutes (this machine's speed drifts by up to 2x between runs), each by this thread's CPU time, which another
    process taking the core does not lengthen."""
    cls = type(of_type[0])
    blobs = [codec.encode(r) for r in of_type]
    plain = [r.to_record() for r in of_type]

    def encode_models() -> None:
        for record in of_type:
            codec.encode(record)

    def decode_models() -> None:
        for blob in blobs:
            codec.decode(blob)

    def encode_records() -> None:
        for record in plain:
            codec.encode_record(name, record)

    def decode_records() -> None:
        for blob in blobs:
            codec.decode_record(blob, cls)

    ways = (encode_models, decode_models, encode_records, decode_records, *_bare_ways(of_type, codec))
    samples: list[list[float]] = [[] for _ in ways]
    for _ in range(repeats):
        for way, taken in zip(ways, samples, strict=True):
            taken.append(cpu_timed(way))
    n = len(of_type)
    rate = [n / statistics.median(taken) for taken in samples]
    return (rate[0], rate[1]), (rate[2], rate[3]), (rate[4], rate[5])


def _furthest_rows(label: str, fastavro_label: str, i: int, rates: dict[str, tuple[float, float]], bare: dict[str, tuple[float, float]],
                   by_type: dict[str, list[AvroModel]]) -> list[Row]:
    """The type whose rate is furthest from fastavro's (way ``i``: 0 encode, 1 decode), every type's ratio in
    the note, and fastavro's rate on that type."""
    ratios = ", ".join(f"{n.removeprefix('litstream.')} {bare[n][i] / rates[n][i]:.2f}x"
                       for n in sorted(rates, key=lambda n: rates[n][i] / bare[n][i]))
    worst = min(rates, key=lambda n: rates[n][i] / bare[n][i])
    short = worst.removeprefix("litstream.")
    return [Row(f"{label}, the type furthest from fastavro", rates[worst][i], None, len(by_type[worst]),
                f"{short}; the codec's time over fastavro's, by type: {ratios}"),
            Row(fastavro_label, bare[worst][i], None, len(by_type[worst]), short)]


# --- the rows -----------------------------------------------------------------------------------------------


def codec_rows(label: str, records: list[Any], codec: Codec, repeats: int) -> tuple[list[Row], list[bytes]]:
    blobs = [codec.encode(r) for r in records]  # also warms fastavro's per-schema caches
    nbytes = sum(map(len, blobs))
    note = f"{nbytes / len(blobs):,.0f} B/msg"

    # Results are dropped, as a streaming consumer does: holding 20k decoded models makes the cyclic GC rescan
    # them and more than doubles the decode time, which would measure the benchmark, not the codec.
    def encode_all() -> None:
        for record in records:
            codec.encode(record)

    def decode_all() -> None:
        for blob in blobs:
            codec.decode(blob)

    enc = repeat(encode_all, repeats)
    dec = repeat(decode_all, repeats)
    return [rate_row(f"codec encode {label}", enc, len(records), nbytes, note),
            rate_row(f"codec decode {label}", dec, len(blobs), nbytes, note)], blobs


def produce_raw(settings: Settings, topic: str, keys: list[bytes], values: list[bytes]) -> float:
    """Produce and flush the pre-encoded values, with a producer that is connected and holds its producer id
    before the clock starts: the idempotent producer's first id request is a start-up cost, not a rate."""
    p = producer(settings)
    p.produce(Topics(settings.topic_prefix).rollout_events, key=b"warm-up", value=values[0])
    flush_or_raise(p, 30.0)
    p.list_topics(topic, timeout=10.0)

    def run() -> None:
        for key, value in zip(keys, values, strict=True):
            while True:
                try:
                    p.produce(topic, key=key, value=value)
                    break
                except BufferError:  # local queue full: serve delivery reports, then retry
                    p.poll(0.05)
            p.poll(0)
        flush_or_raise(p, 60.0)

    return timed(run)


def consume_all(settings: Settings, topic: str, expected: int) -> tuple[float, float, int]:
    """Read every partition from offset 0 with the project's consumer settings, setup included.

    Returns (seconds to the last record, seconds to end-of-partition on all partitions, value bytes). The two
    differ by the fetch that finds a partition's end: the broker holds it for the consumer's fetch.wait.max.ms
    (librdkafka's 500 ms) in case a record comes, so it is a fixed tail, not a rate.
    """
    count, nbytes, last = 0, 0, 0.0
    gc.collect()
    start = time.perf_counter()
    c = consumer(settings, group_id=f"bench-{secrets.token_hex(4)}", **{"enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(settings.partitions)])
        pending = set(range(settings.partitions))
        deadline = time.monotonic() + 60.0
        while pending and time.monotonic() < deadline:
            # A short timeout: consume() waits its whole timeout whenever a batch is not full.
            for msg in c.consume(num_messages=1000, timeout=0.02):
                err = msg.error()
                if err is None:
                    count += 1
                    nbytes += len(msg.value() or b"")
                    if count == expected:
                        last = time.perf_counter() - start
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                else:
                    raise KafkaException(err)
    finally:
        c.close()
    total = time.perf_counter() - start
    if count != expected:
        raise RuntimeError(f"read {count} records back from {topic}, expected {expected}")
    return last, total, nbytes


def _read_to_end(settings: Settings, topic: str, expected: int) -> float:
    """The project's read_to_end, whole call, as the CLI and the tests use it."""
    counted = [0]

    def run() -> None:
        for _ in read_to_end(settings, topic, timeout=60.0):
            counted[0] += 1

    seconds = timed(run)
    if counted[0] != expected:
        raise RuntimeError(f"read_to_end gave {counted[0]} records of {topic}, expected {expected}")
    return seconds


def _send(settings: Settings, spans: list[SpanRecorded], warmup: RolloutEnqueued) -> float:
    events = EventProducer(settings, role="bench")
    events.send(events.topics.rollout_events, warmup)  # connection, metadata and producer id before the clock
    events.flush()

    def run() -> None:
        for span in spans:
            events.send(events.topics.spans, span)
        events.flush(60.0)

    return timed(run)


def broker_rows(ctx: Context, sizes: Sizes, spans: list[SpanRecorded], values: list[bytes],
                warmup: RolloutEnqueued) -> list[Row]:
    keys = [span.key.encode() for span in spans] * sizes.broker_copies
    values = values * sizes.broker_copies
    nbytes = sum(map(len, values))
    span_bytes = nbytes // sizes.broker_copies
    produce_s: list[float] = []
    consume_s: list[float] = []
    eof_tail_s: list[float] = []
    read_s: list[float] = []
    send_s: list[float] = []
    base = f"bench-{secrets.token_hex(4)}"
    # One broker for every repeat, fresh topics per repeat: a JVM's first seconds run cold (interpreted, then
    # compiled), so a broker per repeat would time its warm-up every time; the median is the warm broker.
    with KafkaBroker() as broker:
        for r in range(sizes.broker_repeats):
            ctx.step(f"broker repeat {r + 1}/{sizes.broker_repeats}: produce, consume, read_to_end, "
                     "EventProducer.send")
            settings = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"{base}-{r}",
                                partitions=PARTITIONS)
            create_topics(settings)
            topic = Topics(settings.topic_prefix).spans
            produce_s.append(produce_raw(settings, topic, keys, values))
            to_last, to_eof, consumed = consume_all(settings, topic, len(values))
            if consumed != nbytes:
                raise RuntimeError(f"read {consumed} value bytes back, produced {nbytes}")
            consume_s.append(to_last)
            eof_tail_s.append(to_eof - to_last)
            read_s.append(_read_to_end(settings, topic, len(values)))
            send_s.append(_send(settings, spans, warmup))  # into the same topic, after the read-back
    where = f"Apache Kafka, {PARTITIONS} partitions"
    tail_ms = (statistics.median(read_s) - statistics.median(consume_s)) * 1000
    return [
        rate_row(f"broker produce ({where})", produce_s, len(values), nbytes,
                 "pre-encoded SpanRecorded, incl. flush"),
        rate_row(f"broker consume ({where})", consume_s, len(values), nbytes,
                 f"assign from 0, project consumer settings, incl. setup, to the last record; EOF on all "
                 f"partitions +{statistics.median(eof_tail_s) * 1000:.0f} ms later"),
        rate_row("broker consume via infra.kafka.read_to_end", read_s, len(values), nbytes,
                 f"whole call, to the end-of-partition events: {tail_ms:+.0f} ms beside the row above's last "
                 "record"),
        rate_row("EventProducer.send (encode+produce)", send_s, len(spans), span_bytes,
                 "SpanRecorded, incl. flush"),
    ]


def agl_rows(ctx: Context, sizes: Sizes, variants: list[dict[str, Any]]) -> tuple[list[Row], dict[str, Any]]:
    name = AGL_REQUIREMENT.replace("==", " ")
    labels = (f"{name} InMemory add_span", f"{name} InMemory add_many_spans({sizes.agl_batch})")
    if not ctx.agl:
        return [Row(f"{name} baseline", note="skipped (--no-agl)")], {}
    ctx.step(f"{name} baseline in its own virtualenv")
    config = {"variants": variants, "rollouts": sizes.agl_rollouts, "repeats": sizes.repeats,
              "spans_per_rollout": sizes.agl_spans_per_rollout, "batch": sizes.agl_batch}
    result = run_agl_reference(config, ctx.console)
    if isinstance(result, str):
        return [Row(label, note=f"not run: {result}") for label in labels], {"agl_error": result}
    note = (f"{result['rollouts']} rollouts x 1 attempt, same span contents; "
            f"Python {result['python']}, pydantic {result['pydantic']}")
    n = int(result["n"])
    rows = [rate_row(label, result[op]["samples_s"], n, note=note)
            for label, op in zip(labels, ("add_span", "add_many_spans"), strict=True)]
    return rows, {"agl": {k: result[k] for k in ("version", "python", "pydantic", "n", "batch", "rollouts")}}


def run(ctx: Context) -> Report:
    sizes = QUICK if ctx.quick else FULL
    factory = EventFactory(role="bench")
    codec = Codec()
    variants = span_variants()
    ctx.step(f"building {sizes.spans:,} SpanRecorded and {sizes.enqueued:,} RolloutEnqueued events")
    spans = build_spans(sizes.spans, variants, factory)
    enqueued = build_enqueued(sizes.enqueued, factory)

    ctx.step("codec")
    span_rows, span_values = codec_rows("SpanRecorded", spans, codec, sizes.repeats)
    enq_rows, _ = codec_rows("RolloutEnqueued", enqueued, codec, sizes.repeats)
    span_rows += fastavro_rows("SpanRecorded", list(spans), codec, sizes.repeats)
    enq_rows += fastavro_rows("RolloutEnqueued", list(enqueued), codec, sizes.repeats)
    ctx.step(f"codec, every record type ({sizes.per_type:,} of each)")
    others = build_other_types(sizes.per_type, factory, enqueued[0])
    type_rows = every_type_rows(others, spans[:sizes.per_type], enqueued[:sizes.per_type], codec, sizes.repeats)
    rows = span_rows + enq_rows + type_rows + broker_rows(ctx, sizes, spans, span_values, enqueued[0])
    more_rows, extra = agl_rows(ctx, sizes, variants)
    params = {**asdict(sizes), "partitions": PARTITIONS, "rollouts": ROLLOUTS, "variants": VARIANTS,
              "mb": "1e6 bytes of Avro-encoded values (keys and headers not counted)", **extra}
    return Report(rows + more_rows, params)
