"""The runner: takes rollouts on offer, claims them, runs the agent, reports the outcome.

Each runner process is a member of the runners' group on ``rollout-offers`` (the group splits the partitions
between runners and stores) and claims offers for its ``concurrency`` agent slots with the store's claim protocol
(``streams/claims.py``). An offer is committed once its claim's outcome is known: from then on the attempt's own
lifecycle (heartbeats, timeouts, retries) takes over, so a runner that dies mid-attempt loses nothing — the
attempt goes unresponsive and the rollout is retried per its config.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from litstream.infra import health
from litstream.infra.metrics import StatSeries
from litstream.infra.producer import EventProducer
from litstream.infra.service import Service, set_from_thread
from litstream.infra.settings import Settings
from litstream.schemas.events import RolloutSnapshot
from litstream.schemas.models import AttemptedRollout, NamedResources
from litstream.streams.claims import Claims
from litstream.streams.log_writer import LogWriter, StoreError
from litstream.streams.offers import OfferReader
from litstream.streams.state import rollout_from_snapshot
from litstream.streams.views import ResourcesView

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
CLAIM_RETRY_S = 1.0  # the pause before claiming again after claims went unanswered (the broker is away)
RUNNER_KEEP_FINISHED = 10_000  # finished rollouts the runner's replica keeps (none is on offer again)
RESOURCES_WAIT_S = 30.0  # how long an attempt waits for its rollout's resources to reach this runner's view
BEATS_PER_TIMEOUT = 3  # heartbeats an attempt sends within its rollout's unresponsive_seconds
SLOT_WAIT_S = 1.0  # with every slot busy, the longest wait for one to free before the loop ticks again
MIN_BEAT_S = 0.25  # however short that timeout, no attempt floods the log with beats


def beat_interval(heartbeat_s: float, unresponsive_seconds: float | None) -> float:
    """Seconds between an attempt's heartbeats: the runner's interval, or less when the rollout's config would
    time the attempt out sooner, so that a live attempt is never taken for a dead one (down to ``MIN_BEAT_S``)."""
    if unresponsive_seconds is None:
        return heartbeat_s
    return min(heartbeat_s, max(unresponsive_seconds / BEATS_PER_TIMEOUT, MIN_BEAT_S))


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
        # The claim protocol the store uses too; the replica answering the claims keeps few finished rollouts.
        log_writer = LogWriter(settings, claim_wait_s, role=ROLE, keep_finished=RUNNER_KEEP_FINISHED)
        offers = OfferReader(settings, log_writer.codec, log_writer.rollouts, read_ahead=max(2 * concurrency, 16),
                             leave_when_idle=False, role=ROLE, on_undecodable=log_writer.dead_letter)
        self.claims = Claims(log_writer, offers)
        self.resources = ResourcesView(settings, self.events.codec)
        self._resources_caught_up = False
        # attempt id -> its context and its beats' stop, for a stop that releases them
        self._running: dict[str, tuple[AttemptContext, threading.Event]] = {}
        self._slots = threading.Semaphore(concurrency)
        # Set (from the attempt's thread) when an attempt ends and its slot frees: with every slot busy the loop
        # waits on it instead of turning round.
        self._slot_freed: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stats_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="agent")
        self._inflight: set[Future[None]] = set()

    def report(self) -> Mapping[str, Any]:
        return dict(self.stats)

    def stop(self) -> None:
        self.stop_event.set()

    def run(self, max_rollouts: int | None = None) -> None:
        """Serve offers until stopped (or ``max_rollouts`` attempts were claimed); then drain in-flight attempts.

        Offers are claimed a batch at a time, as many as there are free slots (``claims.Claims``, the store's
        claim protocol): the claims travel together and each is answered by this runner's replica of the fold
        once the broker holds it. With every slot busy the runner stays in the runners' group, fetching nothing."""
        asyncio.run(self._serve(self.max_rollouts if max_rollouts is None else max_rollouts))

    async def _serve(self, max_rollouts: int | None) -> None:
        claimed = 0
        self._loop, self._slot_freed = asyncio.get_running_loop(), asyncio.Event()
        try:
            while not self.stop_event.is_set() and (max_rollouts is None or claimed < max_rollouts):
                self.heartbeat.tick()
                if self.progress.due(time.monotonic(), self.progress_s):
                    log.info("%s", self.progress.line())
                limit = self.concurrency if max_rollouts is None else min(self.concurrency, max_rollouts - claimed)
                free = 0
                while free < limit and self._slots.acquire(blocking=False):
                    free += 1
                if not free:
                    await self.claims.offers.hold()
                    await self._wait_for_a_slot()
                    continue
                won = await self._claim(free)
                if not won:  # nothing on offer: wait for an offer rather than asking again at once
                    for _ in range(free):
                        self._slots.release()
                    await self.claims.offers.wait(SLOT_WAIT_S)
                    continue
                claimed += len(won)
                for snap in won:
                    fut = self._pool.submit(self._run_claimed, snap)
                    self._inflight.add(fut)
                    fut.add_done_callback(self._inflight.discard)
                for _ in range(free - len(won)):
                    self._slots.release()
        finally:
            self._drain()
            log.info("%s (stopped)", self.progress.line())
            await self.claims.offers.close()
            await self.claims.log.close()

    async def _wait_for_a_slot(self) -> None:
        """Until an attempt ends, or ``SLOT_WAIT_S``: the loop still ticks its heartbeat and the offers' group."""
        assert self._slot_freed is not None
        try:
            await asyncio.wait_for(self._slot_freed.wait(), SLOT_WAIT_S)
        except TimeoutError:
            pass
        self._slot_freed.clear()  # before the loop tries the slots again: a later release sets it anew

    def _release_slot(self) -> None:
        self._slots.release()
        set_from_thread(self._loop, self._slot_freed)

    async def _claim(self, limit: int) -> list[RolloutSnapshot]:
        """The snapshots of the claims that won, out of up to ``limit`` offers."""
        lost_before = self.claims.lost
        try:
            won = await self.claims.claim(limit, self.worker_id)
        except StoreError as exc:  # the broker is away: the offers are claimed again once it is back
            log.warning("claims unanswered: %s", exc)
            await asyncio.sleep(CLAIM_RETRY_S)
            return []
        with self._stats_lock:
            self.stats["claimed"] += len(won)
            self.stats["claims_lost"] += self.claims.lost - lost_before
        return won

    def _run_claimed(self, snap: RolloutSnapshot) -> None:
        rollout = rollout_from_snapshot(snap)
        assert isinstance(rollout, AttemptedRollout)
        self._run_attempt(rollout, snap.next_sequence_id)

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
        stop_beats = threading.Event()
        self._running[ctx.attempt_id] = (ctx, stop_beats)
        every_s = beat_interval(self.heartbeat_s, rollout.config.unresponsive_seconds)
        beats = threading.Thread(target=self._beat_attempt, args=(ctx, stop_beats, every_s), daemon=True)
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
            self._release_slot()
        # No flush here: the terminal event leaves in the producer's next batch (linger.ms), with the other slots'
        # records; a flush per attempt would send every slot's records at once in small batches.
        with self._stats_lock:
            self.stats[outcome] += 1
            self.stats["spans"] += ctx.spans_emitted
        self.progress.record(outcome, reward if reward is not None else ctx.last_reward, resources_id)

    @staticmethod
    def _beat_attempt(ctx: AttemptContext, stop: threading.Event, every_s: float) -> None:
        while not stop.wait(every_s):
            try:
                ctx.heartbeat()
            except Exception as exc:  # noqa: BLE001 - the next beat tries again; a stopping runner ends the beats
                if stop.is_set():
                    return
                log.warning("heartbeat of attempt %s failed: %s", ctx.attempt_id, exc)

    def _drain(self) -> None:
        """Let in-flight attempts finish for up to ``drain_s``; release the rest (failed, so they are retried per
        their config) rather than leave them to time out."""
        deadline = time.monotonic() + self.drain_s
        while self._inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        for ctx, stop_beats in list(self._running.values()):
            stop_beats.set()  # a released attempt beats no more (and not into the producer closed below)
            log.warning("releasing attempt %s of %s: the runner is stopping", ctx.attempt_id, ctx.rollout_id)
            ctx.finish("failed", error="released: the runner stopped before the attempt finished")
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.events.close()  # delivers the releases; a producer left open retries a stopped broker for ever
        self.resources.close()


def run(settings: Settings, agent: Any, **options: Any) -> None:
    """Run ``agent`` in the foreground until SIGINT/SIGTERM (or ``max_rollouts`` claims), then drain: ``options``
    are :class:`Runner`'s."""
    Service(settings, ROLE, RUNNER_SERIES).run(lambda s: Runner(s, agent, **options))

