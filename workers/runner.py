"""The runner: takes rollouts on offer, claims them, runs the agent, reports the outcome.

One Kafka consumer per runner process reads ``rollout-offers`` (its group splits the partitions between runner
processes) and hands claimed rollouts to ``concurrency`` agent slots. An offer's offset is committed once the claim
is durable: from then on the attempt's own lifecycle (heartbeats, timeouts, retries) takes over, so a runner that
dies mid-attempt loses nothing — the attempt goes unresponsive and the rollout is retried per its config.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition

from litstream.infra import health, metrics
from litstream.infra.kafka import Backpressure, commit_sync, consumer, poll_batch
from litstream.infra.metrics import StatSeries
from litstream.infra.producer import EventProducer
from litstream.infra.service import Service
from litstream.infra.settings import Settings
from litstream.schemas.codec import DecodeError
from litstream.schemas.events import AttemptStarted, RolloutOffered
from litstream.schemas.models import Attempt, AttemptedRollout, NamedResources, Rollout, new_attempt_id
from litstream.streams.deadletter import DeadLetter
from litstream.streams.state import rollout_from_snapshot
from litstream.streams.views import ResourcesView, RolloutsView

from .agent import AttemptInputs, as_agent
from .progress import Progress
from .sdk import AttemptContext, attempt_context

log = logging.getLogger("litstream.runner")
ROLE = "runner"
RUNNER_SERIES = {
    "claimed": StatSeries("litstream_runner_claims", "Offers claimed, by outcome", {"outcome": "won"}),
    "claims_lost": StatSeries("litstream_runner_claims", "Offers claimed, by outcome", {"outcome": "lost"}),
    "succeeded": StatSeries("litstream_runner_attempts", "Attempts run, by outcome", {"outcome": "succeeded"}),
    "failed": StatSeries("litstream_runner_attempts", "Attempts run, by outcome", {"outcome": "failed"}),
    "spans": StatSeries("litstream_runner_spans", "Spans emitted by the agents"),
}
CLAIM_ROUNDS = 3  # claims sent at most per offer when no outcome comes back
RESOURCES_WAIT_S = 30.0  # how long an attempt waits for its rollout's resources to reach this runner's view


class Runner:
    """``concurrency`` agent slots in one process; ``agent`` is a LitAgent, a LitAgent class or a function (see
    ``agent.py``). New attempts use the resources their rollout names, or else the latest published: a
    resources-published event reaches the next attempt without a restart."""

    def __init__(self, settings: Settings, agent: Any, concurrency: int = 1, heartbeat_s: float = 5.0,
                 claim_wait_s: float = 120.0, drain_s: float = 30.0, progress_s: float = 5.0,
                 max_rollouts: int | None = None) -> None:
        self.settings = settings
        self.agent = as_agent(agent)
        self.drain_s = drain_s
        self.concurrency = concurrency
        self.heartbeat_s = heartbeat_s
        self.events = EventProducer(settings, role=ROLE)
        self.worker_id = self.events.producer_id
        self.stop_event = threading.Event()
        self.max_rollouts = max_rollouts  # run() stops after claiming this many
        self.stats = {"claimed": 0, "claims_lost": 0, "succeeded": 0, "failed": 0, "spans": 0}
        self.heartbeat = health.Heartbeat(settings.data_dir, ROLE, self.report)
        self.progress = Progress()
        self.progress_s = progress_s  # how often the progress line is logged
        self.claim_wait_s = claim_wait_s
        # Tells whether each claim won; keeps snapshots only of the rollouts this runner is claiming.
        self.claims = RolloutsView(settings, self.events.codec, watched_only=True)
        self.resources = ResourcesView(settings, self.events.codec)
        self._resources_caught_up = False
        self._running: dict[str, AttemptContext] = {}  # attempt id -> context, for a stop that releases them
        self._slots = threading.Semaphore(concurrency)
        self._stats_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="agent")
        self._inflight: set[Future[None]] = set()

    def report(self) -> Mapping[str, Any]:
        return dict(self.stats)

    def stop(self) -> None:
        self.stop_event.set()

    def run(self, max_rollouts: int | None = None) -> None:
        """Serve offers until stopped (or ``max_rollouts`` attempts were claimed); then drain in-flight attempts.

        Offers are taken a batch at a time, as many as there are free slots: their claims go out together, are made
        durable with one flush, and the offers are committed with one commit; each slot then waits for its own
        claim's outcome. So the round trip through the lifecycle processor overlaps across slots instead of
        adding up offer after offer."""
        c = consumer(self.settings, group_id=f"{self.settings.topic_prefix}-runners",
                     **{"max.poll.interval.ms": 600_000})
        c.subscribe([self.events.topics.offers])
        gate = Backpressure(c)
        max_rollouts = self.max_rollouts if max_rollouts is None else max_rollouts
        sent = 0
        try:
            while not self.stop_event.is_set():
                if max_rollouts is not None and sent >= max_rollouts:
                    break
                self.heartbeat.tick()
                if self.progress.due(time.monotonic(), self.progress_s):
                    log.info("%s", self.progress.line())
                limit = self.concurrency if max_rollouts is None else min(self.concurrency, max_rollouts - sent)
                free = 0
                while free < limit and self._slots.acquire(blocking=False):
                    free += 1
                # Back-pressure: with every slot busy, pause fetching but keep polling (group membership).
                if not free:
                    gate.hold()
                    held = c.poll(0.1)
                    if held is not None:
                        gate.put_back(held)
                    continue
                gate.release()
                offers = [m for m in poll_batch(c, 0.5, free) if _is_record(m)]
                # A record (no error) always has its topic, partition and offset.
                claims = [self._send_claim(m.value(), str(m.topic()), m.partition() or 0, m.offset() or 0, m.key())
                          for m in offers]
                if offers:
                    self.events.flush()  # the claims are durable before their offers are committed
                    ends: dict[tuple[str, int], int] = {}
                    for m in offers:
                        key = (str(m.topic()), int(m.partition() or 0))
                        ends[key] = max(ends.get(key, 0), int(m.offset() or 0) + 1)
                    commit_sync(c, [TopicPartition(t, p, o) for (t, p), o in ends.items()])
                started = [cl for cl in claims if cl is not None]
                sent += len(started)
                for offer, claim, answer in started:
                    fut = self._pool.submit(self._claim_then_run, offer, claim, answer)
                    self._inflight.add(fut)
                    fut.add_done_callback(self._inflight.discard)
                for _ in range(free - len(started)):
                    self._slots.release()
        finally:
            self._drain()
            log.info("%s (stopped)", self.progress.line())
            c.close()
            self.claims.close()

    def _send_claim(self, value: bytes | None, topic: str, partition: int, offset: int,
                    key: bytes | None) -> tuple[RolloutOffered, AttemptStarted, Future[Any]] | None:
        """Claim an offer (not yet flushed); None for an offer that cannot be read (dead-lettered)."""
        try:
            offer = self.events.codec.decode_as(value, RolloutOffered)
        except DecodeError as exc:
            letter = DeadLetter(topic, partition, offset, key, value, exc.reason, ROLE, "decode")
            self.events.produce_raw(letter.topic, key, value, headers=letter.headers())
            metrics.record_dead_letter(ROLE, letter.source_topic, letter.error_type)
            return None
        self.claims.watch(offer.rollout_id)  # unwatched once the claim phase of _claim_then_run is over
        return (offer, *self._claim(offer))

    def _claim(self, offer: RolloutOffered) -> tuple[AttemptStarted, Future[Any]]:
        """Send one claim of the offer (not flushed) and the future that gets its outcome."""
        claim = AttemptStarted(meta=self.events.factory.meta(offer.rollout_id), attempt_id=new_attempt_id(),
                               sequence_id=offer.attempt_sequence, start_time=time.time(), worker_id=self.worker_id)
        answer = self.claims.expect(claim.meta.event_id)
        self.events.send(self.events.topics.rollout_events, claim)
        return claim, answer

    def _claim_then_run(self, offer: RolloutOffered, claim: AttemptStarted, answer: Future[Any]) -> None:
        try:
            rollout, first_seq = self._claim_outcome(offer, claim, answer)
        finally:
            self.claims.unwatch(offer.rollout_id)
        if rollout is None:
            with self._stats_lock:
                self.stats["claims_lost"] += 1
            self._slots.release()
            return
        with self._stats_lock:
            self.stats["claimed"] += 1
        self._run_attempt(rollout, first_seq)

    def _claim_outcome(self, offer: RolloutOffered, claim: AttemptStarted,
                       answer: Future[Any]) -> tuple[AttemptedRollout | None, int]:
        """Wait for the claim's outcome: the rollout to run (the claim won) or None (lost), and its next sequence id.

        With no outcome in time, the rollout's newest snapshot decides: one of our claims is among its attempts (it
        won; its outcome went missing), the rollout no longer waits for a claim (lost), or there is no trace of the
        claim and the rollout still waits (claim again: a claim can be lost with a processor that died before its
        effects went out). After ``CLAIM_ROUNDS`` rounds with no answer at all, run anyway."""
        first = claim
        mine = {claim.attempt_id: claim}
        answers = {answer: claim.meta.event_id}  # an answer to any of our claims counts: the first sent wins first
        rollout: Rollout | None = None  # an AttemptedRollout once a claim of ours won: checked at the end
        first_seq = 1
        lost = False
        for round_ in range(CLAIM_ROUNDS):
            done, _ = wait(answers, timeout=self.claim_wait_s / CLAIM_ROUNDS, return_when=FIRST_COMPLETED)
            if done:
                outcome = next(iter(done)).result()
            else:
                outcome = self.claims.snapshots.get(offer.rollout_id)
                if outcome is None or (outcome.status in ("queuing", "requeuing")
                                       and not any(a.attempt_id in mine for a in outcome.attempts)):
                    if round_ == CLAIM_ROUNDS - 1:
                        break
                    log.warning("no answer to the claim of %s; claiming again", offer.rollout_id)
                    claim, answer = self._claim(offer)
                    mine[claim.attempt_id] = claim
                    answers[answer] = claim.meta.event_id
                    self.events.flush()
                    continue
            won = next((a for a in outcome.attempts if a.attempt_id in mine), None)
            if won is None or won.attempt_id != outcome.attempts[-1].attempt_id:
                log.info("claim of %s (attempt %d) lost: %s", offer.rollout_id, offer.attempt_sequence,
                         outcome.last_reason)
                lost = True
                break
            rollout, first_seq = rollout_from_snapshot(outcome), outcome.next_sequence_id
            break
        for event_id in answers.values():
            self.claims.forget(event_id)
        if lost:
            return None, first_seq
        if rollout is None:
            # No answer at all (the lifecycle processor is down or far behind): run anyway, as the first claim's
            # attempt — claims are applied in the order they were sent, so if any of ours wins, it is that one.
            # If it lost, the fold rejects this attempt's events; if it won, the work is not wasted.
            log.warning("no answer to the claim of %s within %.0fs; running it", offer.rollout_id, self.claim_wait_s)
            rollout = _rollout_from_offer(offer, first)
        assert isinstance(rollout, AttemptedRollout)
        return rollout, first_seq

    def _resources_for(self, rollout: AttemptedRollout) -> tuple[str | None, NamedResources]:
        self._resources_read(rollout.resources_id)
        state = self.resources.state
        update = state.by_id.get(rollout.resources_id) if rollout.resources_id else None
        update = update or state.latest
        return (update.resources_id, update.resources) if update else (None, {})

    def _resources_read(self, resources_id: str | None) -> None:
        """Wait until this runner's view holds the resources a rollout names, or, for one that names none, until
        the view has read the topic to its end once: a runner started moments before its first offer, or resources
        published just before the enqueue, must not run an attempt without them."""
        view = self.resources
        if resources_id is not None and resources_id not in view.state.by_id:
            if view.wait_for(lambda: True if resources_id in view.state.by_id else None, RESOURCES_WAIT_S) is None:
                log.warning("resources %s not found on the resources topic within %.0fs", resources_id,
                            RESOURCES_WAIT_S)
        elif not self._resources_caught_up:
            self._resources_caught_up = view.caught_up(RESOURCES_WAIT_S)

    def _run_attempt(self, rollout: AttemptedRollout, first_sequence_id: int = 1) -> None:
        resources_id, resources = self._resources_for(rollout)
        ctx = AttemptContext(self.events, rollout.rollout_id, rollout.attempt.attempt_id, resources_id=resources_id,
                             worker_id=self.worker_id, first_sequence_id=first_sequence_id)
        self._running[ctx.attempt_id] = ctx
        stop_beats = threading.Event()
        beats = threading.Thread(target=self._beat_attempt, args=(ctx, stop_beats), daemon=True)
        reward: Any = None
        try:
            ctx.heartbeat()  # the attempt is running
            beats.start()
            with attempt_context(ctx):
                reward = self.agent.run(AttemptInputs(rollout.input, resources, rollout, ctx))
                if reward is not None:
                    ctx.emit_reward(reward)
            ctx.finish("succeeded")
            outcome = "succeeded"
        except Exception as exc:  # the agent's failure is the attempt's failure, recorded with its error
            log.warning("attempt %s of %s failed: %s", ctx.attempt_id, ctx.rollout_id, exc)
            ctx.finish("failed", error="".join(traceback.format_exception_only(exc)).strip()[:4000])
            outcome = "failed"
        finally:
            stop_beats.set()
            self._running.pop(ctx.attempt_id, None)
            self._slots.release()
        # No flush here: the terminal event leaves in the producer's next batch (linger.ms), with the other slots'
        # records; a flush per attempt would send every slot's records at once in small batches.
        with self._stats_lock:
            self.stats[outcome] += 1
            self.stats["spans"] += ctx.spans_emitted
        self.progress.record(outcome, reward if reward is not None else ctx.last_reward, resources_id)

    def _beat_attempt(self, ctx: AttemptContext, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_s):
            ctx.heartbeat()

    def _drain(self) -> None:
        """Let in-flight attempts finish for up to ``drain_s``; release the rest (failed, so they are retried per
        their config) rather than leave them to time out."""
        deadline = time.monotonic() + self.drain_s
        while self._inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        for ctx in list(self._running.values()):
            log.warning("releasing attempt %s of %s: the runner is stopping", ctx.attempt_id, ctx.rollout_id)
            ctx.finish("failed", error="released: the runner stopped before the attempt finished")
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.events.flush()
        self.resources.close()


def run(settings: Settings, agent: Any, **options: Any) -> None:
    """Run ``agent`` in the foreground until SIGINT/SIGTERM (or ``max_rollouts`` claims), then drain: ``options``
    are :class:`Runner`'s."""
    Service(settings, ROLE, RUNNER_SERIES).run(lambda s: Runner(s, agent, **options))


def _is_record(msg: Message) -> bool:
    err = msg.error()
    if err is not None and err.code() != KafkaError._PARTITION_EOF:
        log.warning("offers consumer: %s", err)
    return err is None


def _rollout_from_offer(offer: RolloutOffered, claim: AttemptStarted) -> AttemptedRollout:
    attempt = Attempt(rollout_id=offer.rollout_id, attempt_id=claim.attempt_id, sequence_id=claim.sequence_id,
                      start_time=claim.start_time, worker_id=claim.worker_id)
    return AttemptedRollout(rollout_id=offer.rollout_id, input=offer.input, start_time=claim.start_time,
                            mode=offer.mode, resources_id=offer.resources_id, status="preparing",
                            config=offer.config.model_dump(), metadata=offer.metadata, attempt=attempt)
