"""The trainer as a pipeline process: triplets topic -> windows -> GRPO step -> checkpoint -> resources-published.

Each step writes one checkpoint that holds, with the weights and the optimizer, the consumer's positions on the
triplets topic and the window buffer (groups still waiting for members). A restarted trainer resumes from the
newest checkpoint and seeks to those positions: no triplet trains twice or is lost, whatever the moment of the
crash. Committed group offsets only show progress (lag) to operators.

Each new version is published as ``policy-vN`` (schemas/policy_versions.py): an LLM resource with the version, the
checkpoint and the endpoint — ``torch://<checkpoint>`` (runners load the weights themselves) or the URL of a
vLLM server whose weights the trainer swapped before publishing.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from confluent_kafka import Consumer, Message, TopicPartition

from litstream.infra import health, metrics
from litstream.infra.kafka import consumer, create_topics, missing_topics
from litstream.infra.metrics import StatSeries
from litstream.infra.producer import EventProducer
from litstream.infra.service import Service
from litstream.infra.settings import Settings
from litstream.schemas.codec import DecodeError
from litstream.schemas.events import (
    NamedResourceRecord,
    ResourcesPublished,
    TrainedSample,
    TripletEmitted,
    VersionTrained,
)
from litstream.schemas.policy_versions import POLICY_RESOURCE, policy_resources_id
from litstream.streams.consume_loop import ConsumeLoop, Fetch, Offsets, Record, Work
from litstream.streams.deadletter import DeadLetters, Rejected

from . import toy_task
from .checkpoint import checkpoint_extra, latest_checkpoint, load_weights_into
from .engines import VllmEngine
from .learner import GrpoLearner, LearnerConfig, StepStats
from .policy import PolicyKind, build_policy
from .windows import Window, WindowConfig, Windower

log = logging.getLogger("litstream.trainer")
ROLE = "trainer"
METRICS_FILE = "trainer-metrics.jsonl"


@dataclass
class TrainerConfig:
    policy: PolicyKind = "tiny"
    checkpoint_dir: Path | None = None  # default: <data_dir>/checkpoints, /<run id> in a training run
    group_size: int = 4
    groups_per_step: int = 8
    max_seconds: float | None = None  # also close a window after this long (time window)
    max_staleness: int | None = 2
    keep_last: int = 3
    keep_every: int | None = None  # also keep the weights of every version divisible by this (validation reads them)
    max_steps: int | None = None
    seed: int = 0
    vllm_url: str | None = None  # a vLLM server to hot-swap; None: runners run the torch engine themselves
    sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 1.0,
                                                              "max_tokens": toy_task.MAX_NEW_TOKENS})
    learner: LearnerConfig = field(default_factory=lambda: LearnerConfig(lr=5e-3))
    # Fall back to these weights (a checkpoint directory, e.g. the best validated version's) on start: the run
    # goes on from the newest checkpoint's version, positions and window, and publishes them as the next version.
    restore: Path | None = None
    # A fresh run's version 0 is these weights (a checkpoint directory: a warm start, trainer/rft.py)
    init_from: Path | None = None
    # One sample per multi-turn attempt, its turns joined (trainer/trajectories.py); False: one per LLM call
    trajectories: bool = True

    def learner_config(self) -> LearnerConfig:
        """The learner's settings, scoring at the temperature this trainer publishes: the one agents that read
        ``sampling_parameters`` sample at, and so the one the engine's log-probs are at (greedy: untempered)."""
        temperature = float(self.sampling.get("temperature", 1.0))
        return replace(self.learner, temperature=temperature if temperature > 0 else 1.0)

    def window(self) -> WindowConfig:
        return WindowConfig(group_size=self.group_size, max_samples=self.groups_per_step * self.group_size,
                            max_seconds=self.max_seconds, max_staleness=self.max_staleness,
                            trajectories=self.trajectories)


class TrainerProcess(Work[TripletEmitted]):
    """The trainer's part of the consume loop (``streams/consume_loop.py``): triplets fill windows, a full window
    is a step and a checkpoint, and the positions a checkpoint holds are what is durable."""

    def __init__(self, settings: Settings, cfg: TrainerConfig | None = None) -> None:
        self.settings = settings
        self.cfg = cfg or TrainerConfig()
        # A training run's checkpoints stay its own: the runs of one data dir share it (docs/history.md).
        self.root = self.cfg.checkpoint_dir or settings.data_dir / "checkpoints" / (settings.run_id or "")
        self.events = EventProducer(settings, role=ROLE)
        self.topics = self.events.topics
        self.metrics_path = settings.data_dir / METRICS_FILE
        self.counters = {"steps": 0, "triplets": 0, "version": 0, "waiting_s": 0.0,
                         "training_s": 0.0, "lag": 0.0, "flat_groups": 0, "groups": 0}
        self.positions: dict[int, int] = {}  # partition -> next offset to read
        self.left_out: Counter[str] = Counter()  # samples left out of the loss so far, by reason (sampling.py)
        self.drift: dict[str, float] = {}  # the last step's entropy, KL and clipped share (signals.drift_problem)
        self.restored_from: str | None = None  # the checkpoint whose weights this process fell back to
        self._checkpointed: Offsets = {}  # the positions the newest checkpoint holds
        self._lineage: VersionTrained | None = None  # what trained the newest version (kept in its checkpoint)
        self.records_lineage = _lineage_topic_ready(settings, self.topics.lineage)
        self.vllm = VllmEngine(self.cfg.vllm_url, f"{self.cfg.policy}-policy") if self.cfg.vllm_url else None
        torch.manual_seed(self.cfg.seed)
        latest = latest_checkpoint(self.root)
        if latest is not None:
            self.learner = GrpoLearner.resume(latest, self.cfg.learner_config())
            extra = checkpoint_extra(latest)
            self.positions = {int(p): int(o) for p, o in extra.get("positions", {}).items()}
            if extra.get("lineage"):  # sent again with the version's publication: a crash may have come between
                self._lineage = VersionTrained.model_validate(extra["lineage"])
            snap = extra.get("window")
            self.windower = (Windower.restore(self.cfg.window(), snap) if snap
                             else Windower(self.cfg.window(), self.learner.version))
            self.path = latest
            log.info("resumed policy v%d from %s at positions %s", self.learner.version, latest, self.positions)
        else:
            policy = build_policy(self.cfg.policy, seed=self.cfg.seed)
            if self.cfg.init_from is not None:
                load_weights_into(policy.model, self.cfg.init_from)
            self.learner = GrpoLearner(policy.model, policy.tokenizer, self.cfg.learner_config())
            self.windower = Windower(self.cfg.window(), self.learner.version)
            self.path = self._save()
            log.info("initial policy v0 (%s%s) at %s", self.cfg.policy,
                     f", the weights of {self.cfg.init_from}" if self.cfg.init_from else "", self.path)
        if self.cfg.restore is not None:
            self._restore(self.cfg.restore)
        self.counters["version"] = self.learner.version
        self._last_step_end = time.monotonic()
        self.heartbeat = health.Heartbeat(settings.data_dir, ROLE, self.report, every_s=1.0)
        c = consumer(settings, group_id=f"{settings.topic_prefix}-trainer")
        self.loop = ConsumeLoop(c, [self.topics.triplets], self, DeadLetters(self.events, ROLE), self.heartbeat,
                                Fetch(max_records=512, wait_s=0.2))
        self.stop_event = self.loop.stop_event

    def _restore(self, source: Path) -> None:
        """Load ``source``'s weights (a fresh optimizer: its moments belong to the weights left behind) and save
        them as the next version, published once the process runs."""
        self.learner.restore_weights(source)
        self.learner.version += 1
        self.windower.set_version(self.learner.version)
        self.path = self._save()
        self.restored_from = str(source)
        log.info("fell back to the weights of %s as policy v%d", source, self.learner.version)

    def report(self) -> Mapping[str, Any]:
        return {**self.counters, "dead_letters": self.loop.letters.seen, **self.windower.stats.as_dict(),
                "records_lineage": self.records_lineage,
                "left_out": dict(self.left_out), "restored_from": self.restored_from, **self.drift,
                "trajectories": asdict(self.windower.joins)}

    def stop(self) -> None:
        self.loop.stop()

    # --- publishing ---------------------------------------------------------------------------------------

    def _save(self) -> Path:
        extra = {"positions": {str(p): o for p, o in self.positions.items()}, "window": self.windower.snapshot(),
                 "lineage": self._lineage.model_dump(mode="json") if self._lineage is not None else None}
        path = self.learner.save(self.root, keep_last=self.cfg.keep_last, extra=extra, keep_every=self.cfg.keep_every)
        self._checkpointed = {(self.topics.triplets, p): o for p, o in self.positions.items()}
        return path

    def resource(self) -> NamedResourceRecord:
        version, path = self.learner.version, self.path.resolve()
        return NamedResourceRecord(
            resource_type="llm", endpoint=self.cfg.vllm_url or f"torch://{path}", model=f"{self.cfg.policy}-policy",
            engine="vllm" if self.cfg.vllm_url else "torch", version=version, checkpoint=str(path),
            sampling_parameters=dict(self.cfg.sampling))

    def publish(self) -> float:
        """Swap the server's weights (vLLM) and publish the current version, after what trained it (its lineage;
        again after a restart: the sink keeps one copy); returns the engine reload time."""
        reload_s = self._swap_server_weights() if self.vllm else 0.0
        if self.records_lineage and self._lineage is not None and self._lineage.version == self.learner.version:
            self.events.send(self.topics.lineage, self._lineage)
        now = time.time()
        ev = ResourcesPublished(**self.events.factory.stamp(), resources_id=policy_resources_id(self.learner.version),
                                version=1, create_time=now, update_time=now,
                                resources={POLICY_RESOURCE: self.resource()})
        self.events.send(self.topics.resources, ev)
        self.events.flush()
        return reload_s

    def _swap_server_weights(self) -> float:
        assert self.vllm is not None
        while True:  # the server may still be starting (it loads v0 from the volume this process wrote)
            try:
                return self.vllm.apply_version(self.learner.version, self.path)
            except OSError as exc:
                if self.stop_event.wait(5.0):
                    raise
                log.warning("vLLM server at %s not reachable (%s); retrying", self.cfg.vllm_url, exc)

    # --- consuming ----------------------------------------------------------------------------------------

    def run(self) -> None:
        self.publish()
        metrics.mark_ready()
        try:
            self.loop.run()
        finally:
            self.events.flush()

    # --- the loop's Work ----------------------------------------------------------------------------------

    def assigned(self, c: Consumer, partitions: list[TopicPartition]) -> None:
        # The checkpoint, not the group's committed offsets, says where training stopped.
        for tp in partitions:
            if tp.partition in self.positions:
                tp.offset = self.positions[tp.partition]

    def decode(self, msg: Message) -> TripletEmitted:
        try:
            return self.events.codec.decode_as(msg.value(), TripletEmitted)
        except DecodeError as exc:
            raise Rejected(exc.reason, "decode") from exc

    def apply(self, records: list[Record[TripletEmitted]], read: Offsets) -> None:
        for r in records:
            self.positions[r.partition] = r.offset + 1
            self.counters["triplets"] += 1
            if not self._train(self.windower.add(r.decoded, time.monotonic())):
                return
        self.positions.update({p: o for (_, p), o in read.items()})  # past the turn's dead letters too
        self._train(self.windower.poll(time.monotonic()))

    def _train(self, window: Window | None) -> bool:
        """Train on a closed window; False once the last step is taken (the loop then stops)."""
        if window is not None:
            self.train(window)
        if self._done():
            self.loop.stop()
            return False
        return True

    def durable(self, wait: bool) -> Offsets:
        """Progress for operators only: a restart seeks to the positions of its checkpoint."""
        return self._checkpointed

    def _done(self) -> bool:
        return self.cfg.max_steps is not None and self.counters["steps"] >= self.cfg.max_steps

    def train(self, window: Window) -> StepStats | None:
        if not window.groups:
            return None
        waited = time.monotonic() - self._last_step_end
        by_version: dict[str, list[float]] = {}
        for s in window.samples:
            by_version.setdefault(str(s.policy_version), []).append(s.reward)
        stats = self.learner.step(window.groups)
        self._lineage = lineage({**self.events.factory.stamp(), "run_id": self.events.factory.run_id},
                                self.learner.version, window)
        t0 = time.perf_counter()
        self.path = self._save()
        save_s = time.perf_counter() - t0
        self.windower.set_version(self.learner.version)
        reload_s = self.publish()
        self.counters["steps"] += 1
        self.counters["version"] = self.learner.version
        self.counters["waiting_s"] += waited
        self.counters["training_s"] += stats.seconds
        self.counters["lag"] = stats.version_lag  # the last window's: versions between its samples and the step
        self.counters["flat_groups"], self.counters["groups"] = stats.zero_adv_groups, stats.groups
        self.counters["samples_total"] = self.counters.get("samples_total", 0) + stats.samples
        self.left_out.update(stats.left_out)
        if stats.tokens:
            self.drift = {"entropy": stats.entropy, "kl_start": stats.kl, "clip_frac": stats.clip_frac}
        _observe_step(stats)
        record = {"time": time.time(), "window": window.reason, "wait_s": waited, "save_s": save_s,
                  "reload_s": reload_s, "reward_by_generating_version": {v: sum(r) / len(r)
                                                                         for v, r in by_version.items()},
                  **asdict(stats)}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        log.info("v%d: %d samples in %d groups, reward %.3f, loss %+.4f, step %.2fs, waited %.2fs",
                 stats.version, stats.samples, stats.groups, stats.reward_mean, stats.loss, stats.seconds, waited)
        self._last_step_end = time.monotonic()
        return stats


def _lineage_topic_ready(settings: Settings, topic: str) -> bool:
    """Whether the lineage topic exists, created here if a stack made before it has none; if it cannot be, the
    trainer trains on without recording lineage (never a crash loop over it) and says why once."""
    try:
        if topic in missing_topics(settings):
            create_topics(settings)  # only what is missing
        return True
    except Exception as exc:  # noqa: BLE001 (no permission to create topics, an old broker): said, not fatal
        log.error("no %s topic and it could not be created (%s): versions are trained and published, but what "
                  "trained them is not recorded; run `litstream topics create` and restart the trainer", topic,
                  str(exc).splitlines()[0])
        return False


def lineage(stamp: dict[str, Any], version: int, window: Window) -> VersionTrained:
    """What trained ``version``: each sample of its window, the triplets it holds and where they came from."""
    return VersionTrained(
        **stamp, resources_id=policy_resources_id(version), version=version, time=time.time(), window=window.reason,
        samples=[TrainedSample(rollout_id=s.rollout_id, attempt_id=s.attempt_id, group_id=s.group_id, index=s.index,
                               turns=s.turns, policy_version=s.policy_version, reward=s.reward)
                 for s in window.samples])


def _observe_step(stats: StepStats) -> None:
    metrics.TRAINER_STEP_SECONDS.observe(stats.seconds)
    metrics.TRAINER_TOKENS_PER_SECOND.set(stats.tokens / stats.seconds if stats.seconds > 0 else 0.0)
    metrics.POLICY_VERSION.set(stats.version)
    metrics.TRAINER_REWARD_MEAN.set(stats.reward_mean)


TRAINER_SERIES = {
    "triplets": StatSeries("litstream_trainer_triplets", "Triplets the trainer read"),
    "steps": StatSeries("litstream_trainer_steps", "GRPO steps taken"),
}


def read_metrics(data_dir: Path) -> list[dict[str, Any]]:
    path = data_dir / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(settings: Settings, cfg: TrainerConfig | None = None) -> None:
    """Run the trainer in the foreground until SIGINT/SIGTERM (or ``max_steps``); it is ready once the version it
    starts from is published."""
    Service(settings, ROLE, TRAINER_SERIES, ready_when_built=False).run(lambda s: start_trainer(s, cfg))


def start_trainer(settings: Settings, cfg: TrainerConfig | None) -> TrainerProcess:
    torch.set_num_threads(1)
    trainer = TrainerProcess(settings, cfg)
    metrics.POLICY_VERSION.set(trainer.learner.version)
    return trainer
