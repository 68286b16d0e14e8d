"""The rollout-lifecycle processor (Faust): folds lifecycle events into a table of rollout state.

For each event on ``rollout-events``: decode, apply the pure fold, store the new state in the table (its changelog
makes it durable), publish the snapshot on ``rollout-state`` and, when the rollout goes on offer, an offer on
``rollout-offers``. Undecodable or rejected events go to ``rollout-events.dlq`` with the reason. The snapshot of an
accepted reservation of span sequence ids is held until the next commit, and a later one of the rollout replaces
it: an agent reserves once per span, and nothing else changes.

At-least-once: a redelivered event is recognised by the fold (per-producer sequence) and changes nothing
(docs/guarantees.md, "Exactly-once for the lifecycle processor, measured").
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import os
import signal
import time
import traceback
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import faust
from confluent_kafka import KafkaException

from litstream.infra import health, metrics
from litstream.infra.client_config import faust_group_config
from litstream.infra.failpoints import failpoint
from litstream.infra.metrics import StatSeries
from litstream.infra.producer import EventProducer
from litstream.infra.service import Service
from litstream.infra.settings import Settings
from litstream.infra.topics import LIFECYCLE_TABLE, Topics
from litstream.schemas.codec import Codec, default_codec
from litstream.schemas.events import (
    AttemptStatusChanged,
    EventFactory,
    RolloutOffered,
    RolloutSnapshot,
    SequenceRequested,
)
from litstream.schemas.models import FINISHED, RUNNING

from . import faust_patches, fold, table_store
from .deadletter import DeadLetter
from .decisions import due, next_deadline
from .log_records import Unfoldable, lifecycle_event
from .state import RolloutState
from .worker_fold import attempt_observations

log = logging.getLogger("litstream.lifecycle")
ROLE = "lifecycle"
# Timers: each deadline wakes the processor just after it passes (``_wake_by``), so an attempt is marked timed out
# or unresponsive within milliseconds of its deadline, not up to a tick later; the sweep every TICK_S is the
# safety net (a wake-up lost to a rebalance, refires). Measured with bench/timer_latency.py (docs/benchmarks.md).
TICK_S = 0.1
WAKE_SLACK_S = 0.001  # a wake-up comes this long after its deadline: a timer fires once its deadline has passed
# Outputs wait (and batch) up to this long; the broker spends CPU per request it stores and serves. An offer is
# waited for (a runner or a dequeue), so a burst that made one sends everything at once when the source partition
# has nothing more at hand (EventProducer.send_now). Snapshots and worker observations are not: the store answers
# its callers from its own replica of the fold, so they ride with the next offer or leave after the linger (the
# stock client's agent loop at 16 agents, the broker's request log: the processor's requests through librdkafka
# 3,550 -> 1,850 for 300 rollouts, every request the broker served 17,306 -> 15,161).
OUTPUT_LINGER_MS = 20
# Faust's own producer (the table's changelog, dead letters, timer events) batches this long: no answer waits for
# it (snapshots and offers leave through `outputs`), and a batch of changelog writes costs the broker and this
# process less than a request each (draining 5,000 enqueues, five alternating runs each on a loaded machine, 0 ->
# 5 ms: broker 6.8 -> 6.1 CPU-s, this process 5.1 -> 4.5, means; the agent loop at 16 agents, 5 -> 20 ms together
# with the outputs' linger above, three alternating runs each: median CPU-s broker 16.4 -> 15.5, this process
# 10.9 -> 10.6).
CHANGELOG_LINGER_S = 0.02
# Unfinished rollouts' states kept as objects (3.5 kB each: at most ~70 MiB); a finished one is not kept.
STATE_CACHE_SIZE = 20_000
HEAP_SLACK = 1_000  # superseded timer entries tolerated (beyond one per armed deadline) before the heap is rebuilt
# Timer events sent and not yet back through the log are sent again this often, so that one lost on its way is
# not lost for good (the fold rejects a second one).
REFIRE_AFTER_S = 30.0
# RocksDB: one block cache for every table partition (one database each), charged with their memtables (4 MiB
# each at most, flushed once they hold 32 MiB in all) and their index and filter blocks: the store's whole memory.
ROCKSDB_OPTIONS = {"write_buffer_size": 4 << 20, "max_write_buffer_number": 2}
ROCKSDB_MEMORY = 64 << 20
ROCKSDB_MEMTABLES = 32 << 20


def faust_broker_credentials(settings: Settings) -> dict[str, Any]:
    """Faust/aiokafka settings for SASL/TLS from the same environment as every other client."""
    if settings.kafka_security_protocol == "PLAINTEXT":
        return {}
    import ssl

    ctx = ssl.create_default_context(cafile=settings.kafka_ssl_cafile) if "SSL" in settings.kafka_security_protocol else None
    if settings.kafka_sasl_mechanism:
        password = settings.kafka_sasl_password.get_secret_value() if settings.kafka_sasl_password else ""
        creds = faust.SASLCredentials(username=settings.kafka_sasl_username or "", password=password,
                                      mechanism=settings.kafka_sasl_mechanism, ssl_context=ctx)
        return {"broker_credentials": creds}
    return {"broker_credentials": faust.SSLCredentials(ctx)}


class LifecycleProcessor:
    """The thin Faust edge around the pure fold."""

    def __init__(self, settings: Settings, codec: Codec | None = None, loglevel: str = "info") -> None:
        self.settings = settings
        self.loglevel = loglevel
        self.topics = Topics(settings.topic_prefix)
        self.codec = codec or default_codec(settings.schema_registry_url)
        self.factory = EventFactory(settings.producer_id, role=ROLE, run_id=settings.run_id)
        self.stats = {"applied": 0, "duplicates": 0, "dead_letters": 0, "timeout": 0, "unresponsive": 0,
                      "retries": 0}
        faust_patches.apply()
        self.app = self._faust_app(settings)
        raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
        self.source = self.app.topic(self.topics.rollout_events, partitions=settings.partitions, **raw)
        self.dlq_topic = self.app.topic(self.topics.dlq("rollout-events"), **raw)
        # Values are the state as JSON (the app's default serializer); the changelog makes them durable.
        self.table = self.app.Table(LIFECYCLE_TABLE, partitions=settings.partitions, key_type=str,
                                    options=dict(ROCKSDB_OPTIONS) if settings.table_store == "rocksdb" else None)
        if settings.table_store == "rocksdb":
            table_store.bound_memory(self.table.data, ROCKSDB_MEMORY, ROCKSDB_MEMTABLES)
        # Snapshots, offers and worker observations go out through librdkafka, which sends off the event loop
        # (through Faust's producer each send cost ~0.7 ms of the fold's ~1.5 ms an event); Faust flushes it with
        # its own before every offset commit (faust_patches.flush_with_faust), so at-least-once holds.
        self.outputs = EventProducer(settings, ROLE, self.codec, **{"linger.ms": OUTPUT_LINGER_MS})
        faust_patches.flush_with_faust(self._flush_outputs)
        self.app.agent(self.source, name="fold")(self._fold_stream)
        self.app.timer(interval=2.0)(self._beat)
        if metrics.serving():
            self.app.timer(interval=metrics.STATS_INTERVAL_MS / 1000)(self._report_lag)
        self.app.timer(interval=TICK_S)(self._tick)
        self._deadlines: dict[str, tuple[float, int]] = {}
        self._heap: list[tuple[float, str]] = []
        self._fired: dict[str, tuple[str, str]] = {}
        self._sweeping = asyncio.Lock()  # one pass over the due timers at a time (the tick's, a wake-up's)
        self._wake: asyncio.TimerHandle | None = None  # the next wake-up, at ``_wake_at`` (epoch seconds)
        self._wake_at = math.inf
        self._woken_tasks: set[asyncio.Task[None]] = set()
        self._indexed: tuple[set[int], int] | None = None  # (active partitions, consumer generation) indexed
        self._refired_at = time.monotonic()
        self._ready_told = False
        self._offered = False  # an offer was produced since the last send_now
        # A reservation of span sequence ids changes nothing a reader of ``rollout-state`` waits for (its caller
        # is answered by its own replica of the fold), and an attempt makes one per span: its snapshot is held
        # until the next commit, and dropped if a later snapshot of the rollout goes first.
        self._held_snapshots: dict[str, RolloutSnapshot] = {}
        # The newest state of the rollouts this worker folded lately, as objects: reading the table would decode
        # JSON and validate it again for every event. Valid while the partitions stay here: cleared whenever they
        # move, since another worker may change a rollout meanwhile.
        self._states: OrderedDict[str, RolloutState] = OrderedDict()
        self.app.on_partitions_revoked.connect(self._forget_states)
        self.app.on_partitions_assigned.connect(self._forget_states)
        self.heartbeat = health.Heartbeat(settings.data_dir, ROLE, self.report)

    def _faust_app(self, settings: Settings) -> faust.App:
        """The Faust app: at-least-once, the catalogue's topics only, its table in ``<data_dir>/faust``."""
        datadir = (settings.data_dir / "faust" / self.topics.faust_app_id).resolve()
        datadir.mkdir(parents=True, exist_ok=True)
        return faust.App(
            self.topics.faust_app_id,
            broker=[f"kafka://{s}" for s in settings.bootstrap_servers.split(",")],
            topic_partitions=settings.partitions,
            # Not exactly_once: its transactions would not cover the outputs (they leave through librdkafka,
            # `outputs`), a timeout event would wait for the next commit (p50 1.5 s late), and Faust 0.15.3 never
            # records the table's changelog offset in RocksDB under it. The fold makes redelivery harmless.
            processing_guarantee="at_least_once",
            topic_allow_declare=False,  # every topic comes from the catalogue (litstream topics create)
            topic_disable_leader=True,
            web_enabled=False,
            store=f"{settings.table_store}://",
            table_standby_replicas=0,  # a worker holds only the partitions it owns
            datadir=str(datadir),
            producer_linger=CHANGELOG_LINGER_S,
            broker_client_id=f"litstream-{ROLE}",  # the name the broker's request log and quotas know it by
            **faust_group_config(settings),
            **faust_broker_credentials(settings),
        )

    def report(self) -> Mapping[str, Any]:
        return dict(self.stats)

    def run(self) -> None:
        """Faust's worker, in the foreground until SIGTERM or SIGINT (its own handlers stop it)."""
        from faust.worker import Worker

        Worker(self.app, loglevel=self.loglevel, quiet=True).execute_from_commandline()

    def stop(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the worker's signal handler is its stop

    async def _beat(self) -> None:
        self.heartbeat()

    async def _report_lag(self) -> None:
        """The source topic's lag, from the fetch high-water marks aiokafka keeps (no request of its own) and
        the offsets Faust last committed."""
        if self.app.rebalancing or self.app.in_recovery:
            return
        consumer = self.app.consumer
        committed = getattr(consumer, "_committed_offset", {})  # Faust keeps no public view of it
        name = self.source.get_topic_name()
        lags: dict[tuple[str, str], int] = {}
        try:
            for tp in consumer.assignment():
                end = consumer.highwater(tp) if tp.topic == name else None
                if end is not None:
                    lags[(tp.topic, str(tp.partition))] = max(0, end - (committed.get(tp) or 0))
        except Exception as exc:  # noqa: BLE001 - a metric must never stop the processor
            log.debug("lag not available now: %s", exc)
            return
        metrics.LAG.set_group(self.topics.faust_app_id, lags)

    async def _fold_stream(self, stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            await self.handle(msg.key, msg.value, msg.topic, msg.partition, msg.offset)
            if self._offered and self._read_to_end(msg):  # nothing more at hand: the burst's offers go out now
                self._offered = False
                self.outputs.send_now()

    def _read_to_end(self, msg: Any) -> bool:
        """Whether ``msg`` is the last record of its partition that the latest fetch knew of."""
        try:
            end = self.app.consumer.highwater(msg.tp)
        except Exception:  # noqa: BLE001 - no fetch position (a rebalance): treat as the end
            return True
        return end is None or msg.offset + 1 >= end

    async def handle(self, key: bytes | None, value: bytes | None, topic: str, partition: int, offset: int) -> None:
        def dead(reason: str, kind: str) -> DeadLetter:
            return DeadLetter(topic, partition, offset, key, value, reason, ROLE, kind)

        event = lifecycle_event(self.codec, topic, key, value)
        if isinstance(event, Unfoldable):
            await self._dead_letter(dead(event.reason, event.kind))
            return
        rid = event.rollout_id
        try:
            state = self._load(rid)
            outcome = fold.apply(state, event)
        except Exception as exc:  # a bug in the fold must not stop the partition
            log.exception("fold failed for %s", rid)
            await self._dead_letter(dead(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}", "error"))
            return
        if outcome.duplicate:
            self.stats["duplicates"] += 1
            if state is not None:
                if self.settings.table_store == "rocksdb":
                    # A worker killed after a local RocksDB write but before its changelog write comes back with
                    # state the changelog lacks; writing it again puts it where the partition's next owner reads
                    # it. (An in-memory table is rebuilt from the changelog, so it holds nothing the log lacks.)
                    self._save(rid, partition, state)
                await self._resend_effects(event, state)
            return
        new = outcome.state
        if new is not None:
            self._save(rid, partition, new)
            failpoint("lifecycle.after-table-write")  # fault tests: die with the change in the table, not on Kafka
            self._arm(rid, new, partition)
            snapshot = new.snapshot(event.meta, outcome.accepted, outcome.reason, outcome.reserved)
            self._publish_state(rid, snapshot, hold=outcome.accepted and isinstance(event, SequenceRequested))
        if not outcome.accepted:
            await self._dead_letter(dead(outcome.reason or "rejected", "rejected"))
            return
        self.stats["applied"] += 1
        if new is not None:
            await self._observe_worker(event, state, new)
        if outcome.offer is not None and new is not None:
            if outcome.offer.attempt_sequence > 1:
                self.stats["retries"] += 1
            self._output(self.topics.offers, rid, self._offer(new, outcome.offer.attempt_sequence))
            self._offered = True

    async def _resend_effects(self, event: Any, state: RolloutState) -> None:
        """A redelivered event may have been applied by a worker that died before its effects went out (the
        table's changelog is written before the snapshot and the offer are sent). Send again what the state implies:
        the offer of a rollout on offer (claims are version-checked, so a second offer can win nothing twice), and
        the snapshot when this event was the last one applied (a claimant may be waiting for its outcome)."""
        if state.status in ("queuing", "requeuing"):
            self._output(self.topics.offers, state.rollout_id, self._offer(state, len(state.attempts) + 1))
            self._offered = True
        if state.updated_ns == event.meta.timestamp_ns:
            reserved = state.next_sequence_id - event.count if isinstance(event, SequenceRequested) else None
            snapshot = state.snapshot(event.meta, True, None, reserved)
            self._publish_state(state.rollout_id, snapshot, hold=reserved is not None)

    def _offer(self, state: RolloutState, attempt_sequence: int) -> RolloutOffered:
        """The offer of ``state``'s next attempt, from values the fold holds (validated again by pydantic-core,
        without encoding the task input again to check it is JSON: :func:`~litstream.schemas.events.rebuilt`)."""
        return RolloutOffered.rebuilt(meta=self.factory.meta(state.rollout_id), attempt_sequence=attempt_sequence,
                                      input=state.input, mode=state.mode, resources_id=state.resources_id,
                                      config=state.config, metadata=state.metadata)

    async def _observe_worker(self, event: Any, before: RolloutState | None, after: RolloutState) -> None:
        """Workers are derived from attempts: tell the workers topic when an attempt's status or worker changed."""
        for obs in attempt_observations(before, after, event.meta.timestamp_ns / 1e9, self.factory.stamp):
            self._output(self.topics.workers, obs.worker_id, obs)

    def _output(self, topic: str, key: str, record: Any) -> None:
        self.outputs.produce_raw(topic, key.encode(), self.codec.encode(record))

    def _publish_state(self, rid: str, snapshot: RolloutSnapshot, hold: bool) -> None:
        """Send ``snapshot`` on ``rollout-state``, or, ``hold``, keep it until the next commit: a snapshot of the
        rollout sent before then supersedes it (it carries the whole newer state)."""
        if hold:
            self._held_snapshots[rid] = snapshot
            return
        self._held_snapshots.pop(rid, None)
        self._output(self.topics.state, rid, snapshot)

    def _send_held_snapshots(self) -> None:
        held, self._held_snapshots = self._held_snapshots, {}
        for rid, snapshot in held.items():
            self._output(self.topics.state, rid, snapshot)

    async def _flush_outputs(self) -> None:
        """Every output sent, the held snapshots included (raises if one was refused: the commit must not pass
        it)."""
        self._send_held_snapshots()
        await asyncio.to_thread(self.outputs.flush, None)  # an overloaded broker costs time, not a crash

    def _load(self, rid: str) -> RolloutState | None:
        state = self._states.get(rid)
        if state is not None:
            self._states.move_to_end(rid)
            return state
        raw = self.table.get(rid)
        if raw is None:
            return None
        state = RolloutState.model_validate(raw["state"])
        self._remember(rid, state)
        return state

    def _save(self, rid: str, partition: int, state: RolloutState) -> None:
        self.table[rid] = {"partition": partition, "state": state.model_dump(mode="json")}
        self._remember(rid, state)

    def _remember(self, rid: str, state: RolloutState) -> None:
        if state.status in FINISHED:  # mostly no event comes any more; one that reopens it is rare: read the table
            self._states.pop(rid, None)
            return
        self._states[rid] = state
        self._states.move_to_end(rid)
        while len(self._states) > STATE_CACHE_SIZE:
            self._states.popitem(last=False)

    async def _forget_states(self, *_args: Any, **_kwargs: Any) -> None:
        self._states.clear()
        self._send_held_snapshots()  # the partitions may move: their snapshots go out with this owner's commit

    # -- timers: timeout and unresponsive, on this processor's clock --------------------------------------------

    def _arm(self, rid: str, state: RolloutState, partition: int) -> None:
        """Index the rollout's next deadline (or drop it); a heap with lazy deletion finds the due ones."""
        self._fired.pop(rid, None)
        deadline = next_deadline(state)
        if deadline is None:
            self._deadlines.pop(rid, None)
            return
        self._deadlines[rid] = (deadline.at, partition)
        heapq.heappush(self._heap, (deadline.at, rid))
        self._wake_by(deadline.at)
        if len(self._heap) > 2 * len(self._deadlines) + HEAP_SLACK:  # mostly superseded entries: keep the live
            self._heap = [(at, key) for key, (at, _) in self._deadlines.items()]
            heapq.heapify(self._heap)

    def _active_partitions(self) -> set[int]:
        name = self.source.get_topic_name()
        return {tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == name}

    def _rebuild_index(self, actives: set[int], generation: int) -> None:
        """After a rebalance or recovery: index the deadlines of every rollout this worker now owns. A full pass
        over the table, so only then: between rebalances every change goes through ``_arm``."""
        self._deadlines.clear()
        self._heap.clear()
        self._fired.clear()
        for rid, raw in self.table.items():  # read-only pass: nothing here awaits or writes the table
            if raw.get("partition") in actives and raw["state"].get("status") in RUNNING:  # the rest has no timer
                self._arm(rid, RolloutState.model_validate(raw["state"]), raw["partition"])
        self._indexed = (actives, generation)

    def _refire(self) -> None:
        """Put the timers sent since the last call back on the heap: one whose event is still not folded (lost on
        its way) fires again at this tick. Also drops those of rollouts this worker no longer owns."""
        for rid in self._fired:
            current = self._deadlines.get(rid)
            if current is not None:
                heapq.heappush(self._heap, (current[0], rid))
        self._fired.clear()
        self._refired_at = time.monotonic()

    def _wake_by(self, at: float) -> None:
        """Run the timers just after ``at`` (epoch seconds), unless a wake-up comes sooner already. Outside the
        event loop (a test folding by hand) the sweep finds the deadline instead."""
        if at >= self._wake_at:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._wake is not None:
            self._wake.cancel()
        self._wake_at = at
        self._wake = loop.call_later(max(0.0, at - time.time()) + WAKE_SLACK_S, self._woken)

    def _woken(self) -> None:
        self._wake, self._wake_at = None, math.inf
        task = asyncio.ensure_future(self._tick())
        self._woken_tasks.add(task)  # held until done: the loop keeps only a weak reference to a task
        task.add_done_callback(self._tick_done)

    def _tick_done(self, task: asyncio.Task[None]) -> None:
        self._woken_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # the sweep tries again at its next tick
            log.error("timers failed at a deadline", exc_info=task.exception())

    async def _tick(self) -> None:
        """Fire the due timers (every TICK_S, and at each deadline: ``_wake_by``), then wake at the next one."""
        if self.app.rebalancing or self.app.in_recovery:
            return  # no wake-up is asked for meanwhile: the sweep resumes once the partitions are settled
        if not self._ready_told:  # timers start once recovery is done: say so now, not at the 2 s beat
            self._ready_told = True
            metrics.mark_ready()
            await self._beat()
        async with self._sweeping:
            actives = self._active_partitions()
            generation = self.app.consumer_generation_id  # a rebalance that gave back the same partitions changes it
            if self._indexed != (actives, generation):
                self._rebuild_index(actives, generation)
            elif time.monotonic() - self._refired_at > REFIRE_AFTER_S:
                self._refire()
            if self._fire_due(actives, time.time()):
                self.outputs.send_now()  # waited for by whoever reads the attempt: not held for the linger
            if self._heap:
                self._wake_by(self._heap[0][0])  # in the future: every entry already due was taken above

    def _fire_due(self, actives: set[int], now: float) -> int:
        """Write an ``AttemptStatusChanged`` for every timer due at ``now``; how many were written."""
        fired = 0
        while self._heap and self._heap[0][0] < now:
            at, rid = heapq.heappop(self._heap)
            current = self._deadlines.get(rid)
            if current is None or current[0] != at or current[1] not in actives:
                continue  # superseded by a later change, or no longer ours
            state = self._load(rid)
            kind = due(state, now) if state is not None else None
            attempt = state.latest_attempt if state is not None else None
            if kind is None or attempt is None:
                continue
            if self._fired.get(rid) == (attempt.attempt_id, kind):
                continue  # already sent; waiting for it to come back through the log
            self._fired[rid] = (attempt.attempt_id, kind)
            self.stats[kind] += 1
            event = AttemptStatusChanged(meta=self.factory.meta(rid), attempt_id=attempt.attempt_id, status=kind,
                                         time=now, worker_id=attempt.worker_id)
            # Through the outputs' producer, flushed before every commit like the snapshots and offers; one lost
            # on its way is sent again (``_refire``), and the fold refuses a second one.
            self._output(self.topics.rollout_events, rid, event)
            fired += 1
        return fired

    async def _dead_letter(self, letter: DeadLetter) -> None:
        self.stats["dead_letters"] += 1
        metrics.record_dead_letter(ROLE, letter.source_topic, letter.error_type)
        log.warning("dead letter from %s[%d]@%d: %s", letter.source_topic, letter.partition, letter.offset,
                    letter.reason.splitlines()[0])
        await self.dlq_topic.send(key=letter.key, value=letter.value, headers=letter.headers())




LIFECYCLE_SERIES = {
    "applied": StatSeries("litstream_events", "Lifecycle events read, by outcome", {"outcome": "applied"}),
    "duplicates": StatSeries("litstream_events", "Lifecycle events read, by outcome", {"outcome": "duplicate"}),
    "dead_letters": StatSeries("litstream_events", "Lifecycle events read, by outcome", {"outcome": "dead_letter"}),
    "timeout": StatSeries("litstream_attempt_timeouts", "Attempts this processor timed out, by kind",
                          {"kind": "timeout"}),
    "unresponsive": StatSeries("litstream_attempt_timeouts", "Attempts this processor timed out, by kind",
                               {"kind": "unresponsive"}),
    "retries": StatSeries("litstream_retries", "Rollouts offered again for another attempt"),
}


def run(settings: Settings, loglevel: str = "info") -> None:
    """Run the processor in the foreground until interrupted; ready once its table is recovered."""
    Service(settings, ROLE, LIFECYCLE_SERIES, ready_when_built=False, own_signals=True).run(
        lambda s: start_lifecycle(s, loglevel))


def start_lifecycle(settings: Settings, loglevel: str) -> LifecycleProcessor:
    """The processor, its local table copy dropped if it is ahead of its changelog (a log that was reset)."""
    processor = LifecycleProcessor(settings, loglevel=loglevel)
    if settings.table_store == "rocksdb":
        try:
            table_store.discard_if_ahead(settings, Path(processor.app.conf.tabledir), LIFECYCLE_TABLE,
                                         processor.topics.lifecycle_changelog)
        except KafkaException as exc:  # the broker is not up yet: Faust waits for it; the copy is kept
            log.warning("could not compare the local table copy with its changelog (%s); keeping it", exc)
    return processor
