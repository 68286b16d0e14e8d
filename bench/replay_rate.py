"""replay_rate: events/s of rebuilding rollout state from the log, and of the fold alone.

litstream: a log of K lifecycle events over R rollouts (per rollout: RolloutEnqueued from a client, then from a
runner AttemptStarted, H AttemptHeartbeat and AttemptStatusChanged(succeeded), phase after phase as a batch of
rollouts runs), built with EventFactory and produced with EventProducer onto rollout-events of an embedded broker
(no processor: replay reads the source of truth, not the derived topics). Timed:

* replay: ``streams.replay.replay(settings)``, the whole call (`litstream replay`): read rollout-events from the
  beginning to its end, decode, fold;
* decode + fold: the same encoded records decoded and folded in memory (no broker);
* fold: ``streams.replay.fold_events`` on the in-memory events (the pure fold the processor runs);
* bare fastavro: the same bodies decoded into dicts by the library alone, the most a replay in one process reaches.

Every run must rebuild R succeeded rollouts from K applied events.

Agent Lightning 0.3.0 has no replay: its state lives in the store's process. The closest counterpart is the time
its InMemoryLightningStore takes to apply the same operations through its API (enqueue_rollout, dequeue_rollout,
H x update_attempt(last_heartbeat_time) and update_attempt(status="succeeded") per rollout), one call at a time.
"""

from __future__ import annotations

import io
import time
from dataclasses import asdict, dataclass
from typing import Any

import fastavro

from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.codec import Codec
from litstream.schemas.events import (
    AttemptHeartbeat,
    AttemptStarted,
    AttemptStatusChanged,
    AvroRolloutConfig,
    Event,
    EventFactory,
    RolloutEnqueued,
)
from litstream.schemas.models import new_attempt_id, new_rollout_id
from litstream.streams.replay import ReplayResult, fold_events, replay

from .harness import Context, Report, Row, rate_row, repeat, timed
from .lifecycle import AGL, agl_baseline, broker_settings

TITLE = "replay events/s (read the log and fold) and the fold alone, with Agent Lightning 0.3.0 for reference"


@dataclass(frozen=True)
class Sizes:
    rollouts: int
    heartbeats: int  # per attempt: events per rollout = 3 + heartbeats
    repeats: int
    replay_repeats: int  # a replay takes ~0.5 s and shares the broker's cores: more repeats for its median


FULL = Sizes(rollouts=2000, heartbeats=7, repeats=3, replay_repeats=5)  # 20,000 events
QUICK = Sizes(rollouts=200, heartbeats=7, repeats=1, replay_repeats=1)  # 2,000 events


def build_log(rollouts: int, heartbeats: int) -> list[Event]:
    """The lifecycle events of `rollouts` rollouts that each ran once and succeeded, in log order."""
    client, runner = EventFactory(role="bench-client"), EventFactory(role="bench-runner")
    config = AvroRolloutConfig(timeout_seconds=300.0, unresponsive_seconds=60.0, max_attempts=2,
                               retry_condition=["timeout", "unresponsive"])
    ids = [(new_rollout_id(), new_attempt_id()) for _ in range(rollouts)]
    now = time.time()
    events: list[Event] = []
    for i, (rid, _) in enumerate(ids):
        events.append(RolloutEnqueued(meta=client.meta(rid), input={"task": i}, start_time=now, mode="train",
                                      config=config, metadata={"dataset": "bench", "epoch": 1}))
    for rid, aid in ids:
        events.append(AttemptStarted(meta=runner.meta(rid), attempt_id=aid, sequence_id=1, start_time=now + 1,
                                     worker_id="runner-1"))
    for beat in range(heartbeats):
        for rid, aid in ids:
            events.append(AttemptHeartbeat(meta=runner.meta(rid), attempt_id=aid, time=now + 2 + beat,
                                           worker_id="runner-1", max_sequence_id=beat + 1))
    for rid, aid in ids:
        events.append(AttemptStatusChanged(meta=runner.meta(rid), attempt_id=aid, status="succeeded",
                                           time=now + 3 + heartbeats, worker_id="runner-1"))
    return events


def check(result: ReplayResult, sizes: Sizes, k: int) -> None:
    """A rate of a wrong state is no rate: every event applied, every rollout succeeded."""
    if result.events != k or result.applied != k or result.by_status() != {"succeeded": sizes.rollouts}:
        raise RuntimeError(f"replay rebuilt {result.summary()}, expected {k} events applied and "
                           f"{sizes.rollouts} succeeded rollouts")


def produce(settings: Settings, events: list[Event]) -> float:
    producer = EventProducer(settings, role="bench")

    def send_all() -> None:
        for event in events:
            producer.send(producer.topics.rollout_events, event)
        producer.flush(120.0)

    return timed(send_all)


def litstream_rows(ctx: Context, sizes: Sizes) -> tuple[list[Row], dict[str, Any]]:
    events = build_log(sizes.rollouts, sizes.heartbeats)
    k = len(events)
    codec = Codec()
    values = [codec.encode(e) for e in events]
    nbytes = sum(map(len, values))

    def decode_fold() -> None:
        check(fold_events(codec.decode(v) for v in values), sizes, k)  # type: ignore[misc]

    def fold_only() -> None:
        check(fold_events(events), sizes, k)

    # The library alone on the same bodies (each with its record's schema, into dicts): no replay in this process
    # decodes faster, whatever it folds.
    bodies = [(codec.writer_schema(type(e).avro_name), v[10:]) for e, v in zip(events, values, strict=True)]

    def bare_decode() -> None:
        for schema, body in bodies:
            fastavro.schemaless_reader(io.BytesIO(body), schema, None)

    ctx.step(f"fold alone, decode + fold, and bare fastavro's decode of {k:,} events, in memory")
    fold_s = repeat(fold_only, sizes.repeats)
    decode_fold_s = repeat(decode_fold, sizes.repeats)
    bare_s = repeat(bare_decode, sizes.repeats)

    replay_s: list[float] = []
    inside_s: list[float] = []
    with broker_settings(ctx, "replay_rate") as settings:
        ctx.step(f"producing {k:,} lifecycle events over {sizes.rollouts:,} rollouts")
        produce_s = produce(settings, events)
        results: list[ReplayResult] = []
        for r in range(sizes.replay_repeats):
            ctx.step(f"replay {r + 1}/{sizes.replay_repeats}")
            replay_s.append(timed(lambda: results.append(replay(settings))))
            check(results[-1], sizes, k)
            inside_s.append(results[-1].seconds)
    per = f"{sizes.rollouts:,} rollouts x {3 + sizes.heartbeats} events"
    rows = [
        rate_row("litstream replay (read rollout-events + decode + fold)", replay_s, k, nbytes,
                 f"whole replay(settings) call, 4 partitions, {per}; read_to_end's consumer setup and "
                 f"end-of-partition wait included"),
        rate_row("litstream decode + fold, in memory", decode_fold_s, k, nbytes, "Codec().decode, then the fold"),
        rate_row("litstream fold_events (the pure fold)", fold_s, k, None, "decoded events, no I/O"),
        rate_row("bare fastavro decode of the same events", bare_s, k, nbytes,
                 "schemaless_reader into dicts, no model, no fold: the most one process replays"),
    ]
    params = {"events": k, "bytes": nbytes, "produce_s": produce_s, "replay_inside_s": inside_s}
    return rows, params


def agl_rows(ctx: Context, sizes: Sizes, k: int) -> tuple[list[Row], dict[str, Any]]:
    label = f"{AGL} InMemory: apply the same operations"
    config = {"mode": "apply_ops", "rollouts": sizes.rollouts, "heartbeats": sizes.heartbeats,
              "repeats": sizes.repeats}
    result, missing = agl_baseline(ctx, config, [label])
    if result is None:
        return missing, {}
    if int(result["ops"]) != k:
        raise RuntimeError(f"the baseline applied {result['ops']} operations, the log holds {k} events")
    note = (f"no replay in Agent Lightning (state lives in the store's process); the counterpart: the log's "
            f"{k:,} operations through the API, one call at a time: enqueue_rollout, dequeue_rollout, "
            f"{sizes.heartbeats} x update_attempt(last_heartbeat_time), update_attempt(succeeded)")
    return [rate_row(label, result["samples_s"], k, note=note)], {
        "agl": {key: result[key] for key in ("version", "python", "pydantic", "rollouts", "heartbeats", "ops",
                                             "samples_s")}}


def run(ctx: Context) -> Report:
    sizes = QUICK if ctx.quick else FULL
    rows, params = litstream_rows(ctx, sizes)
    more, extra = agl_rows(ctx, sizes, params["events"])
    return Report(rows + more, {**asdict(sizes), **params, **extra,
                                "mb": "1e6 bytes of Avro-encoded event values"})
