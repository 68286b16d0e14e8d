"""Training algorithms, as the reference's ``Algorithm``: they drive rollouts and publish resources.

An algorithm sees the running system only through a :class:`Driver` (implemented by ``litstream.app.fit``
over Kafka: rollouts go through the rollout events and the lifecycle processor, rewards come back on the spans
topic, resources go to the resources topic). Nothing here knows about processes, the shell or the runners, so an
algorithm is pure of the stack and a user can write one (see ``docs/training.md``).

Three are provided:

* :class:`Baseline` runs every task once (mode ``train``) and every validation task once; nothing is trained.
* :class:`GRPO` starts the GRPO trainer process (triplets -> windows -> update -> ``policy-vN``) and feeds it
  ``group_size`` copies of each task, grouped by the task's data id, validating on version 0 and every
  ``val_every`` versions.
* :class:`PromptSearch` publishes prompt templates instead of weights (as the reference's APO): each candidate is
  scored by validation reward, a critic (any OpenAI-compatible endpoint) may propose new ones, the best is kept.
"""

from __future__ import annotations

import abc
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from litstream.schemas.models import NamedResources, PromptTemplate
from litstream.schemas.policy_versions import parse_policy_version, policy_resources_id

from .defaults import check_lr, defaults_for, with_lora_lr
from .rft import RftConfig
from .sampling import left_out_text
from .signals import (
    TRY_WHEN_DEGRADING,
    DriftBands,
    ValEstimate,
    WindowSignal,
    best_version,
    drift_problem,
    missing_signal,
    plateaued,
    val_estimate,
    val_warning,
    validation_falling,
    window_signal,
)

TRAIN, VAL = "train", "val"


@dataclass(frozen=True)
class RolloutResult:
    """One finished rollout: its status, its final reward (None when it failed or emitted none) and the policy
    version (or resources id) it ran with."""

    rollout_id: str
    mode: str
    status: str
    reward: float | None
    version: int | None
    resources_id: str | None
    data_id: str | None = None
    dimensions: dict[str, float] = field(default_factory=dict)  # the reward's other named dimensions


@dataclass(frozen=True)
class Policy:
    """A published policy the runners can use: its version and the resources id that carries it."""

    version: int
    resources_id: str


class Driver(Protocol):
    """What an algorithm can do with the running system."""

    def submit(self, tasks: Sequence[Any], *, mode: str, resources_id: str | None = None,
               metadata: Sequence[dict[str, Any]] | None = None) -> list[str]:
        """Enqueue one rollout per task; returns their rollout ids."""

    def poll(self, timeout: float = 0.5) -> list[RolloutResult]:
        """Rollouts that finished since the last call (waits up to ``timeout`` for the first)."""

    def outstanding(self) -> int:
        """Rollouts submitted and not yet returned by :meth:`poll`."""

    def cancel(self, rollout_ids: Sequence[str]) -> int:
        """Cancel those of these rollouts that no runner has begun yet (still queued); returns how many. Each is
        returned by :meth:`poll` as ``cancelled``."""

    def publish(self, resources: NamedResources, resources_id: str | None = None) -> str:
        """Publish resources (runners use the newest for rollouts that name none); returns the id."""

    def latest_policy(self) -> Policy | None:
        """The newest policy version ready for rollouts (served to agents), if any."""

    def resources(self, resources_id: str) -> NamedResources:
        """The resources published under an id (empty when unknown)."""

    def servable(self, resources_id: str) -> bool:
        """Whether agents can run with the resources published under an id: known, and, where a policy server
        publishes itself, fronted by it (a server that caught up past a version never serves that one)."""

    def start_service(self, name: str, *args: str) -> None:
        """Start a pipeline process by its ``litstream`` arguments (e.g. the GRPO trainer)."""

    def service_info(self, name: str) -> dict[str, Any]:
        """The health report of a process started by :meth:`start_service` (empty until it reports)."""

    def stopping(self) -> bool:
        """True once the user asked to stop (Ctrl-C): finish quickly, nothing more to submit."""

    def show(self, message: str) -> None:
        """A progress line for the user (may be thinned out)."""

    def notice(self, message: str) -> None:
        """A line the user must see: a warning, a verdict."""

    def trajectories(self, run: str) -> tuple[str, list[dict[str, Any]]]:
        """A training run's trajectories from the log, as ``litstream export`` writes them (trainer/export.py):
        the run named by its id, a unique prefix of it or its name; returns its id and its records."""

    def work_dir(self) -> Path:
        """A directory of this run's own, kept with its checkpoints (a resumed run finds it again)."""


def run_all(driver: Driver, tasks: Sequence[Any], mode: str, resources_id: str | None = None,
            timeout: float | None = None) -> list[RolloutResult]:
    """Submit one rollout per task and wait until all finished (or the user stops)."""
    metadata = _val_metadata(tasks) if mode == VAL else [{"data_id": str(i)} for i in range(len(tasks))]
    ids = set(driver.submit(tasks, mode=mode, resources_id=resources_id, metadata=metadata))
    results: list[RolloutResult] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    while ids and not driver.stopping() and (deadline is None or time.monotonic() < deadline):
        for r in driver.poll():
            if r.rollout_id in ids:
                ids.discard(r.rollout_id)
                results.append(r)
    return results


def mean_reward(results: Sequence[RolloutResult]) -> float | None:
    """Mean reward, a failed rollout or one without reward counting as 0 (it did not do the task)."""
    if not results:
        return None
    return sum(r.reward or 0.0 for r in results) / len(results)


@dataclass
class History:
    """What an algorithm measured: rewards by split and policy version, rollout counts."""

    train: dict[int, list[float]] = field(default_factory=dict)
    val: dict[int, list[float]] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)

    def add(self, r: RolloutResult, version: int | None = None) -> None:
        self.statuses[r.status] = self.statuses.get(r.status, 0) + 1
        if r.status == "cancelled":
            return  # never ran: no reward to count
        v = version if version is not None else (r.version or 0)
        (self.val if r.mode == VAL else self.train).setdefault(v, []).append(r.reward or 0.0)

    @property
    def rollouts(self) -> int:
        return sum(self.statuses.values())

    @property
    def failed(self) -> int:
        """Rollouts that did not succeed: failed, or left unfinished (a cancelled one was never run)."""
        return sum(n for s, n in self.statuses.items() if s not in ("succeeded", "cancelled"))

    @staticmethod
    def means(by_version: dict[int, list[float]]) -> dict[int, float]:
        return {v: sum(rs) / len(rs) for v, rs in sorted(by_version.items()) if rs}


class Algorithm(abc.ABC):
    """Drives rollouts through a :class:`Driver`; records what it measured in ``self.history``."""

    name = "algorithm"
    trains_policy = False  # True: it starts a trainer; the policy server follows its versions
    uses_triplets = False  # True: the triplet processor must run

    def __init__(self) -> None:
        self.history = History()
        self.validations: dict[int, Validation] = {}  # what ``validate`` measured, by policy version

    @abc.abstractmethod
    def run(self, driver: Driver, train: Sequence[Any], val: Sequence[Any] | None) -> None:
        """Train on ``train`` (validating on ``val``) until done or ``driver.stopping()``."""

    def prepare(self, driver: Driver) -> None:
        """Start what the algorithm needs before the runners start (default: nothing)."""

    def report(self) -> dict[str, Any]:
        """What the algorithm found, beyond the rewards (JSON-able; added to the fit summary)."""
        return {}

    def validate(self, driver: Driver, val: Sequence[Any], policy: Policy | None) -> float | None:
        results = run_all(driver, val, VAL, resources_id=policy.resources_id if policy else None)
        version = policy.version if policy else 0
        for r in results:
            self.history.add(r, version)
        measured = Validation.of(results)
        if measured is not None:
            self.validations[version] = measured
        return mean_reward(results)


@dataclass(frozen=True)
class Validation:
    """One validation: the reward over tasks and the reward's other named dimensions, each with its standard
    error."""

    reward: ValEstimate
    dimensions: dict[str, ValEstimate]

    @classmethod
    def of(cls, results: Sequence[RolloutResult]) -> Validation | None:
        """From a validation's rollouts, a rollout's task being its data id; a failed rollout scores 0 (as in
        ``mean_reward``), a cancelled one was never run."""
        rewards: dict[str, list[float]] = {}
        dims: dict[str, dict[str, list[float]]] = {}
        for i, r in enumerate(results):
            if r.status == "cancelled":
                continue
            task = r.data_id or str(i)
            rewards.setdefault(task, []).append(r.reward or 0.0)
            for name, value in r.dimensions.items():
                dims.setdefault(name, {}).setdefault(task, []).append(value)
        return cls.over_tasks(rewards, dims)

    @classmethod
    def over_tasks(cls, rewards: Mapping[str, Sequence[float]],
                   dimensions: Mapping[str, Mapping[str, Sequence[float]]]) -> Validation | None:
        """From each task's rewards, and each dimension's values by task (None: no reward at all)."""
        reward = val_estimate(rewards)
        if reward is None:
            return None
        return cls(reward, {name: e for name, by_task in dimensions.items()
                            if (e := val_estimate(by_task)) is not None})

    def text(self, note: str = "") -> str:
        """``0.680 ± 0.029 (256 tasks × 1){note}; tool_call 0.801 ± 0.025``"""
        return self.reward.text() + note + "".join(f"; {name} {e.mean:.3f} ± {_se_text(e)}"
                                            for name, e in self.dimensions.items())

    def as_dict(self) -> dict[str, Any]:
        return ({**_estimate_dict(self.reward), "tasks": self.reward.tasks, "samples": self.reward.samples}
                | ({"dimensions": {n: _estimate_dict(d) for n, d in self.dimensions.items()}} if self.dimensions
                   else {}))


class Baseline(Algorithm):
    """No training: each task once, each validation task once (the reference's ``Baseline``, for ``dev``)."""

    name = "baseline"

    def __init__(self, passes: int = 1) -> None:
        super().__init__()
        self.passes = passes

    def run(self, driver: Driver, train: Sequence[Any], val: Sequence[Any] | None) -> None:
        policy = driver.latest_policy()
        for _ in range(self.passes):
            results = run_all(driver, train, TRAIN, resources_id=policy.resources_id if policy else None)
            for r in results:
                self.history.add(r, policy.version if policy else 0)
            driver.show(f"baseline: {len(results)} rollouts, mean reward {mean_reward(results) or 0:.3f}")
        if val:
            self.validate(driver, val, policy)
            measured = self.validations.get(policy.version if policy else 0)
            if measured is not None:
                driver.show(f"baseline: validation reward {measured.text()}")

    def report(self) -> dict[str, Any]:
        return {"validation": {str(v): m.as_dict() for v, m in sorted(self.validations.items())}}


@dataclass
class GRPO(Algorithm):
    """The GRPO trainer, driven by a dataset: ``group_size`` copies of each task (grouped by the task's data id),
    one training window of groups per published version, validation on version 0, every ``val_every`` versions
    and on the last version; the best validated version is published at the end.

    Settings left ``None`` come from the model's defaults (``litstream.trainer.defaults``). With none of
    ``passes``, ``minutes`` and ``max_versions`` given, the run goes over the training set again and again until
    the model's first-run budget; whatever the bounds, it stops once ``patience`` validations in a row did not
    beat the best one (early stop)."""

    model: str = "tiny"
    group_size: int | None = None
    groups_per_step: int | None = None
    passes: int | None = None  # passes over the training set (None: as many as the budget allows)
    val_every: int = 5
    val_samples: int = 1  # rollouts per validation task (their mean is the task's score)
    patience: int | None = 4  # stop after this many validations without a new best (None: never)
    in_flight: int | None = None  # default: two training windows
    max_staleness: int = 2
    lr: float | None = None
    ppo_epochs: int | None = None
    entropy_coef: float | None = None
    entropy_fade: bool = True  # the entropy bonus fades as the window's mean reward nears 1 (LearnerConfig)
    lr_by_signal: bool | None = None  # the step's learning rate times the share of groups with signal
    # Train only the top N transformer blocks and the final norm (LearnerConfig.train_top_layers); 0: every
    # parameter; None: the model's default
    train_top_layers: int | None = None
    # LoRA adapters of this rank train in place of the model's weights (LearnerConfig.lora_rank); None: off
    lora_rank: int | None = None
    lr_schedule: str = "constant"  # constant | cosine | linear, over max_versions (LearnerConfig)
    temperature: float | None = None  # published with each version; agents that read sampling_parameters use it
    max_tokens: int | None = None  # published with each version, as temperature
    window_seconds: float | None = 20.0  # a short dataset still trains: a window also closes after this long
    max_versions: int | None = None  # stop after this many training steps (the trainer stops there too)
    minutes: float | None = None  # stop submitting after this long; the rollouts in flight still finish
    settle_seconds: float = 60.0  # at the end, how long the rollouts in flight get to finish
    # True: a training rollout names the policy served when it was submitted; False: it runs on the newest one
    # when a runner claims it (fresher, but an agent may see a publication before the policy server fronts it)
    pin_versions: bool = True
    # True: submit one training window of groups (pinned to the version) each time a new policy version is
    # published, two windows ahead at the start: every sample is trained one version after the one that made it
    # (one-step off-policy). A free-running queue instead lets samples age by two or more versions, which the
    # toy task measured as far slower learning (docs/training.md).
    waves: bool = True
    stall_seconds: float = 15.0  # waves: how long nothing outstanding and no new version counts as a stall
    signal_windows: int = 5  # this many windows in a row without signal: say so (signals.missing_signal)
    publish_best: bool = True  # at the end, publish the best validated version again (runners default to it)
    # Watch each step's entropy, KL to the starting policy and clipped share (signals.DriftBands; None: for
    # pretrained models) and validation falling twice in a row: the run says so and falls back to the best
    # validated version, at most ``max_fallbacks`` times (then it stops).
    watch_drift: bool | None = None
    # A multi-turn attempt trains as one sequence, its turns joined (trainer/trajectories.py); False: each call
    trajectories: bool = True
    # Start from a warm start (trainer/rft.py): version 0 fine-tuned on the best trajectories of this run (its id,
    # a unique prefix or its name) or of this dataset file (`litstream export`'s JSONL or Parquet)
    warm_start: str | None = None
    rft: RftConfig = field(default_factory=RftConfig)
    drift_bands: DriftBands = field(default_factory=DriftBands)
    max_fallbacks: int = 2
    seed: int = 0
    name: str = "grpo"
    trains_policy = True
    uses_triplets = True

    def __post_init__(self) -> None:
        super().__init__()
        d = defaults_for(self.model)
        if self.lora_rank:
            d = with_lora_lr(d)
        for name, value in (("group_size", d.group_size), ("groups_per_step", d.groups_per_step), ("lr", d.lr),
                            ("ppo_epochs", d.epochs), ("entropy_coef", d.entropy_coef),
                            ("temperature", d.temperature), ("max_tokens", d.max_tokens),
                            ("lr_by_signal", d.lr_by_signal), ("train_top_layers", d.train_top_layers or 0)):
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.watch_drift is None:
            self.watch_drift = d.pretrained
        if int(self.train_top_layers or 0) < 0:
            raise ValueError(f"train_top_layers must be 0 (every parameter) or more, not {self.train_top_layers}")
        if self.max_versions is not None and self.max_versions < 0:
            raise ValueError(f"max_versions must be 0 (version 0 only) or more, not {self.max_versions}")
        if self.lora_rank is not None and self.lora_rank < 1:
            raise ValueError(f"lora_rank must be at least 1, not {self.lora_rank}")
        verdict = check_lr(self.model, float(self.lr or 0.0), lora=bool(self.lora_rank))
        if verdict is not None and verdict[0] == "refuse":
            raise ValueError(verdict[1])
        self.warnings: list[str] = [verdict[1]] if verdict is not None else []
        self.first_run_budget = self.passes is None and self.minutes is None and self.max_versions is None
        if self.first_run_budget:
            self.minutes, self.max_versions = d.minutes, d.max_versions
        self.tag = uuid.uuid4().hex[:8]  # group ids of this run, distinct from any earlier run on the same topic
        self._idle_since: float | None = None  # waves: since when nothing was outstanding without a new version
        self.signals: list[WindowSignal] = []  # one per training window (the groups of one policy version)
        self.no_signal: str | None = None
        self.stopped: str | None = None  # why the run ended (budget, early stop, the user)
        self.best: dict[str, Any] | None = None
        self._groups: dict[int, dict[str, list[float]]] = {}  # window -> group -> rewards
        self._group_of: dict[str, tuple[int, str]] = {}  # training rollout -> (window, group)
        self._expected: dict[int, int] = {}  # window -> training rollouts submitted (a window is all of them)
        self._window_version: dict[int, int] = {}  # window -> the version its rollouts are pinned to
        self._val_of: dict[str, int] = {}  # validation rollout -> version
        self.val_ids: set[str] = set()  # every validation rollout of the run
        self._val_rewards: dict[int, dict[str, list[float]]] = {}  # version -> task -> rewards
        self._val_dims: dict[int, dict[str, dict[str, list[float]]]] = {}  # version -> dimension -> task -> values
        self._val_pending: dict[int, int] = {}  # version -> validation rollouts not back yet
        self._warned_val = False
        self._last_rollout: str | None = None
        self.watch = _DriftWatch(self.drift_bands if self.watch_drift else None)
        self.fallbacks: list[dict[str, Any]] = []  # each fall back to the best validated version: why, to what
        self.warm: dict[str, Any] | None = None  # what the warm start trained on and how long it took

    # --- what the run is ------------------------------------------------------------------------------------

    def budget_text(self) -> str:
        bounds = [f"{self.passes} pass(es)" if self.passes else "",
                  f"{self.minutes:g} minutes" if self.minutes else "",
                  f"{self.max_versions} versions" if self.max_versions is not None else ""]
        text = " or ".join(b for b in bounds if b) or "one pass"
        if self.first_run_budget:
            text += f" (the first-run budget of {self.model})"
        if self.patience:
            text += f", or {self.patience} validations without a new best"
        return text

    def settings_text(self) -> str:
        scaled = ", scaled by the share of groups with signal" if self.lr_by_signal else ""
        trained = (f"LoRA adapters of rank {self.lora_rank} trained" if self.lora_rank
                   else f"the top {self.train_top_layers} transformer blocks trained" if self.train_top_layers
                   else "every parameter trained")
        return (f"{self.model}: lr {self.lr:g} ({self.lr_schedule}{scaled}), {trained}, "
                f"{self.group_size} rollouts per group, "
                f"{self.groups_per_step} groups per step, {self.ppo_epochs} optimizer step(s) per window, "
                f"temperature {self.temperature:g}, {self.max_tokens} response tokens, entropy bonus "
                f"{self.entropy_coef:g}{' (fading with the reward)' if self.entropy_fade and self.entropy_coef else ''}"
                f"{f'; a warm start from {self.warm_start}' if self.warm_start else ''}; until {self.budget_text()}")

    def trainer_args(self) -> list[str]:
        return ["process", "trainer", "--policy", self.model, "--group-size", str(self.group_size),
                "--groups-per-step", str(self.groups_per_step), "--max-staleness", str(self.max_staleness),
                "--lr", str(self.lr), "--epochs", str(self.ppo_epochs), "--entropy-coef", str(self.entropy_coef),
                "--seed", str(self.seed), "--temperature", str(self.temperature), "--max-tokens",
                str(self.max_tokens), "--lr-schedule", self.lr_schedule,
                *(["--entropy-fade"] if self.entropy_fade else []),
                *(["--lr-by-signal"] if self.lr_by_signal else []),
                *(["--train-top-layers", str(self.train_top_layers)] if self.train_top_layers else []),
                *(["--lora-rank", str(self.lora_rank)] if self.lora_rank else []),
                *(["--watch-kl"] if self.watch_drift else []),
                "--trajectories" if self.trajectories else "--per-call",
                *(["--keep-every", str(self.val_every)] if self.val_every else []),
                *(["--window-seconds", str(self.window_seconds)] if self.window_seconds else []),
                *(["--max-steps", str(self.max_versions)] if self.max_versions is not None else [])]

    def prepare(self, driver: Driver) -> None:
        for w in self.warnings:
            _notice(driver, f"warning: {w}")
        start = self._warm_start(driver) if self.warm_start else None
        driver.start_service("trainer", *self.trainer_args(), *(["--init-from", str(start)] if start else []))

    def _warm_start(self, driver: Driver) -> Path:
        """Version 0's weights: the model fine-tuned on the best trajectories ``warm_start`` names (trainer/rft.py),
        once per run (a resumed run finds them in its work dir)."""
        from . import export
        from .checkpoint import latest_checkpoint
        from .rft import fine_tune, select_best

        out = driver.work_dir() / "warm-start"
        done = latest_checkpoint(out)
        if done is not None:
            return done
        source = Path(str(self.warm_start))
        if source.is_file():
            name, records = str(source), export.read(source)
        else:
            try:
                name, records = driver.trajectories(str(self.warm_start))
            except LookupError as exc:
                raise LookupError(f"warm start: {exc}; nor is {self.warm_start!r} a dataset file") from None
        chosen = select_best(records, self.rft)
        _notice(driver, f"warm start from {name}: {chosen.text()}")
        if not chosen.rows:
            raise ValueError(f"warm start from {name}: no training trajectory with a reward of at least "
                             f"{self.rft.min_reward:g} and its token ids to fine-tune on")
        tuned = fine_tune(self.model, chosen.rows, out, self.rft, train_top=self.train_top_layers or None,
                          seed=self.seed, progress=driver.show)
        self.warm = {"source": name, "trajectories": chosen.kept, "tasks": chosen.tasks, **tuned.as_dict()}
        loss = (f", loss {tuned.first_loss:.3f} -> {tuned.last_loss:.3f}"
                if tuned.first_loss is not None and tuned.last_loss is not None else "")
        _notice(driver, f"warm start: fine-tuned in {tuned.steps} steps, {tuned.seconds:.0f} s{loss}")
        return tuned.checkpoint

    # --- the run --------------------------------------------------------------------------------------------

    def run(self, driver: Driver, train: Sequence[Any], val: Sequence[Any] | None) -> None:
        policy = wait_for_policy(driver, lambda p: p.version >= 0, 600.0)
        if val:
            self._validate_now(driver, val, policy)
        queue = _TaskQueue(train, self.passes)
        if self.max_versions == 0:  # version 0 only (a warm start, validated): nothing to train
            queue.clear()
        size = int(self.group_size or 1)
        in_flight = self.in_flight or 2 * size * int(self.groups_per_step or 1)
        next_val = self.val_every
        deadline = time.monotonic() + self.minutes * 60 if self.minutes else None
        settle: float | None = None
        waves_sent = policy.version  # waves start from the version the run begins with
        while (queue or driver.outstanding()) and not driver.stopping():
            policy = driver.latest_policy() or policy
            if queue and self._budget_spent(driver, deadline):
                self._stop_submitting(driver, queue)  # the rollouts running finish; those still queued are cancelled
            if not queue:
                settle = settle or time.monotonic() + self.settle_seconds
                if time.monotonic() > settle:
                    break
            if val and self.val_every and policy.version >= next_val and queue:
                self._submit_val(driver, val, policy.version // self.val_every * self.val_every, policy)
                next_val = (policy.version // self.val_every + 1) * self.val_every
            if self.waves:
                waves_sent = self._submit_waves(driver, queue, policy, waves_sent)
            while not self.waves and queue and driver.outstanding() + size <= max(in_flight, size):
                self._submit_groups(driver, queue, 1, policy.resources_id if self.pin_versions else None)
            for r in driver.poll():
                self._take(driver, r)
            if queue:
                self._check_degrading(driver, queue)
            if queue and self.patience and plateaued(self.val_estimates, self.patience):
                best = best_version(self.val_estimates)
                self.stopped = (f"validation stopped improving: {self.patience} validations without beating "
                                f"v{best} ({self.val_estimates[best].text()})" if best is not None else "")
                _notice(driver, f"early stop: {self.stopped}")
                self._stop_submitting(driver, queue)
            driver.show(self._progress(driver, policy, queue))
        if driver.outstanding():
            self.history.statuses["unfinished"] = driver.outstanding()
        if driver.stopping():
            self.stopped = "stopped by the user"
        elif self.stopped is None:
            self.stopped = f"budget reached ({self.budget_text()})"
        self._finish(driver, val)
        self._drop_unfinished_validations(driver)  # after the last one: a late result of another is still taken
        self._publish_best(driver)

    def _take(self, driver: Driver, r: RolloutResult) -> None:
        """One finished rollout: into the history, its group (a window's signal), or its validation."""
        version = self._val_of.pop(r.rollout_id, None)
        self.history.add(r, version)
        self._last_rollout = r.rollout_id
        if version is not None:
            self._val_rewards.setdefault(version, {}).setdefault(r.data_id or "", []).append(r.reward or 0.0)
            for name, value in r.dimensions.items():
                self._val_dims.setdefault(version, {}).setdefault(name, {}).setdefault(r.data_id or "", []).append(value)
            self._val_pending[version] -= 1
            if self._val_pending[version] == 0:
                self._val_done(driver, version)
            return
        where = self._group_of.pop(r.rollout_id, None)
        if where is None:
            return
        key, group = where
        groups = self._groups.setdefault(key, {})
        if r.status == "cancelled":  # never ran: its window's signal is what the others give
            self._expected[key] = self._expected.get(key, 1) - 1
        else:
            groups.setdefault(group, []).append(r.reward or 0.0)
        if groups and sum(len(rs) for rs in groups.values()) == self._expected.get(key):
            self.signals.append(window_signal(self._window_version.get(key, -1),
                                              list(self._groups.pop(key).values())))
            message = missing_signal(self.signals, self.signal_windows, self._last_rollout)
            if message and self.no_signal is None:
                self.no_signal = message
                _notice(driver, message)

    def _validate_now(self, driver: Driver, val: Sequence[Any], policy: Policy) -> None:
        """Validate ``policy`` and wait for it (version 0, the last version)."""
        self._submit_val(driver, val, policy.version, policy)
        while self._val_pending.get(policy.version) and not driver.stopping():
            for r in driver.poll():
                self._take(driver, r)

    def _submit_val(self, driver: Driver, val: Sequence[Any], version: int, latest: Policy) -> None:
        if version in self._val_pending:
            return
        rid = policy_resources_id(version)
        if version != latest.version and not driver.servable(rid):
            version, rid = latest.version, latest.resources_id
        tasks = [t for t in val for _ in range(self.val_samples)]
        meta = [{"group_id": f"val-{uuid.uuid4().hex}", "data_id": str(i)}
                for i in range(len(val)) for _ in range(self.val_samples)]
        ids = driver.submit(tasks, mode=VAL, resources_id=rid, metadata=meta)
        self._val_of.update(dict.fromkeys(ids, version))
        self.val_ids.update(ids)
        self._val_pending[version] = len(ids)

    @property
    def val_estimates(self) -> dict[int, ValEstimate]:
        """Each validated version's reward estimate (kept once, in ``validations``)."""
        return {v: m.reward for v, m in self.validations.items()}

    def _val_done(self, driver: Driver, version: int) -> None:
        measured = Validation.over_tasks(self._val_rewards.get(version, {}), self._val_dims.get(version, {}))
        if measured is None:
            return
        self.validations[version] = measured
        est = measured.reward
        best = best_version(self.val_estimates)
        note = " (best so far)" if best == version else ""
        driver.show(f"v{version}: validation reward {measured.text(note)}")
        warning = val_warning(est)
        if warning and not self._warned_val:
            self._warned_val = True
            self.warnings.append(warning)
            _notice(driver, f"warning: {warning}")

    def _check_degrading(self, driver: Driver, queue: _TaskQueue) -> None:
        """Say when the policy is being damaged, and fall back to the best validated version (the trainer
        restarts from the newest checkpoint with that version's weights, published as the next version)."""
        info = driver.service_info("trainer")
        for line in self.watch.left_out_news(info):
            self.warnings.append(line)
            _notice(driver, f"warning: {line}")
        reason = self.watch.drifting(info) or validation_falling(self.val_estimates, self.watch.since)
        if reason is None:
            return
        best = best_version(self.val_estimates)
        checkpoint = self._checkpoint_of(driver, best) if best is not None else None
        version = int(info.get("version", 0))
        if checkpoint is None or best is None or len(self.fallbacks) >= self.max_fallbacks \
                or not Path(checkpoint).is_dir():  # pruned, or on another machine: nothing to fall back to
            self.stopped = f"the policy is degrading ({reason}); {TRY_WHEN_DEGRADING}"
            _notice(driver, f"early stop: {self.stopped}")
            self._stop_submitting(driver, queue)
            return
        self.fallbacks.append({"at_version": version, "to_version": best, "reason": reason})
        _notice(driver, f"the policy is degrading at v{version}: {reason}. Falling back to v{best}, the best "
                        f"validated version ({self.val_estimates[best].text()}); {TRY_WHEN_DEGRADING}")
        driver.start_service("trainer", *self.trainer_args(), "--restore", checkpoint)
        self.watch.restart(version + 1)

    def _checkpoint_of(self, driver: Driver, version: int) -> str | None:
        resources = driver.resources(policy_resources_id(version))
        return next((str(getattr(r, "checkpoint")) for r in resources.values() if getattr(r, "checkpoint", None)),
                    None)

    def _submit_waves(self, driver: Driver, queue: _TaskQueue, policy: Policy, waves_sent: int) -> int:
        """One window of groups per published version, two ahead; returns the waves sent so far. If nothing is
        outstanding and no new version came for ``stall_seconds`` (failed rollouts left a window that cannot
        fill, or the trainer's window is larger than a wave), one more wave goes out on the current version.

        A wave waits while more than one wave's rollouts are still out, and while a validation is: a trainer
        that closes its windows on time publishes versions faster than a slow model's waves come back, and the
        queue would grow without bound, its rollouts going stale before they run and a validation waiting
        behind them all."""
        now = time.monotonic()
        if driver.outstanding() or waves_sent < policy.version + 2:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now
        stalled = self._idle_since is not None and now - self._idle_since > self.stall_seconds
        wave = int(self.group_size or 1) * int(self.groups_per_step or 1)
        while queue and (waves_sent < policy.version + 2 or stalled):
            if not stalled and (len(self._group_of) > wave or any(self._val_pending.values())):
                break
            self._submit_groups(driver, queue, int(self.groups_per_step or 1), policy.resources_id,
                                window=waves_sent)
            waves_sent += 1
            stalled, self._idle_since = False, None
        return waves_sent

    def _submit_groups(self, driver: Driver, queue: _TaskQueue, groups: int, resources_id: str | None,
                       window: int | None = None) -> None:
        """``groups`` tasks from the queue, ``group_size`` rollouts each, grouped by the task's data id. Their
        results make up one window's signal: ``window`` (a wave), else the version they are pinned to."""
        size = int(self.group_size or 1)
        version = parse_policy_version(resources_id)
        key = window if window is not None else (version if version is not None else -1)
        self._window_version[key] = version if version is not None else -1
        for _ in range(groups):
            if not queue:
                break
            p, i, task = queue.pop()
            group_id = f"{self.tag}-p{p}-d{i}"
            meta = {"group_id": group_id, "data_id": str(i), "pass": p}
            ids = driver.submit([task] * size, mode=TRAIN, resources_id=resources_id, metadata=[meta] * size)
            for rid in ids:
                self._group_of[rid] = (key, group_id)
            self._expected[key] = self._expected.get(key, 0) + len(ids)

    def _stop_submitting(self, driver: Driver, queue: _TaskQueue) -> None:
        """No more training rollouts: the queue is cleared, and those submitted that no runner has begun are
        cancelled, so the last validation does not wait behind them and the run ends near its budget."""
        queue.clear()
        cancelled = driver.cancel(list(self._group_of))
        if cancelled:
            _notice(driver, f"{cancelled} queued training rollout(s) cancelled: the run submits no more")

    def _drop_unfinished_validations(self, driver: Driver) -> None:
        """A validation the run ended before is left out of the rewards by version (a part of its tasks is not
        an estimate of the version), and the run says so."""
        for version, pending in sorted(self._val_pending.items()):
            if pending and version in self.history.val:
                done = len(self.history.val.pop(version))
                _notice(driver, f"the validation of v{version} did not finish ({done} of {done + pending} "
                                "rollouts): left out of the results")

    def _budget_spent(self, driver: Driver, deadline: float | None) -> bool:
        trained = int(driver.service_info("trainer").get("version", 0))
        return ((self.max_versions is not None and trained >= self.max_versions)
                or (deadline is not None and time.monotonic() > deadline))

    def _progress(self, driver: Driver, policy: Policy, queue: _TaskQueue) -> str:
        train = History.means(self.history.train)
        last_train = f"{train[max(train)]:.3f}" if train else "-"
        last_val = "-"
        if self.val_estimates:
            v = max(self.val_estimates)
            last_val = f"{self.val_estimates[v].text()} (v{v})"
        window = f"; window v{self.signals[-1].version}: {self.signals[-1].text()}" if self.signals else ""
        info = driver.service_info("trainer")
        # versions between the policy that made the last window's samples and the step that took them
        staleness = f"; staleness {float(info.get('lag', 0.0)):.1f} versions" if info else ""
        left = sum(self.watch.left_out.values())
        if left:  # samples the learner could not score as drawn (trainer/sampling.py)
            staleness += f"; {left} samples left out of the loss ({', '.join(self.watch.left_out)})"
        return (f"policy v{policy.version}: train reward {last_train}, validation {last_val}{window}{staleness}; "
                f"{self.history.rollouts} rollouts done, {queue.remaining_text()} tasks queued")

    def _finish(self, driver: Driver, val: Sequence[Any] | None) -> None:
        """Let the trainer take its last window, then validate the version it ends on."""
        if driver.stopping() or self.max_versions == 0 or (self.max_versions is not None and not val):
            return
        before = driver.latest_policy()
        deadline = time.monotonic() + (self.window_seconds or 0.0) + 10
        while time.monotonic() < deadline and not driver.stopping():
            info = driver.service_info("trainer")
            if int(info.get("version", -1)) > (before.version if before else -1):
                break
            time.sleep(0.5)
        trained = int(driver.service_info("trainer").get("version", 0))
        policy = wait_for_policy(driver, lambda p: p.version >= trained, 60.0)
        if val and policy.version not in self.val_estimates:
            self._validate_now(driver, val, policy)

    def _publish_best(self, driver: Driver) -> None:
        """Publish the best validated version again, under its own id: the newest resources, so runners (and a
        policy server following the topic) take it; the summary names the id and the checkpoint."""
        best = best_version(self.val_estimates)
        if best is None or not self.publish_best:
            return
        resources = driver.resources(policy_resources_id(best))
        checkpoint = next((str(getattr(r, "checkpoint", "") or "") for r in resources.values()
                           if getattr(r, "checkpoint", None)), None)
        self.best = {"version": best, "validation": self.val_estimates[best].mean,
                     "validation_se": self.val_estimates[best].se, "checkpoint": checkpoint, "resources_id": None}
        if resources and not driver.stopping():
            rid = driver.publish(resources, f"best-{self.tag}-{policy_resources_id(best)}")
            self.best["resources_id"] = rid
            _notice(driver, f"best validated version v{best} ({self.val_estimates[best].text()}) published as "
                            f"{rid}" + (f"; checkpoint {checkpoint}" if checkpoint else ""))

    def report(self) -> dict[str, Any]:
        return {"best": self.best, "stopped": self.stopped, "no_signal": self.no_signal,
                "fallbacks": list(self.fallbacks), "left_out": self.watch.left_out,
                "warnings": list(self.warnings), "settings": self.settings_text(), "warm_start": self.warm,
                "validation": {str(v): m.as_dict() for v, m in sorted(self.validations.items())},
                "windows": [{"version": w.version, "groups": w.groups, "flat": w.flat,
                             "spread": round(w.spread, 4), "reward": round(w.reward_mean, 4)} for w in self.signals]}


def _estimate_dict(e: ValEstimate) -> dict[str, float | None]:
    return {"mean": round(e.mean, 4), "se": round(e.se, 4) if e.se != float("inf") else None}


def _se_text(e: ValEstimate) -> str:
    return "n/a" if e.se == float("inf") else f"{e.se:.3f}"


class _DriftWatch:
    """What the run has seen of the trainer's step statistics: each version's drift verdict, the first step's
    entropy (the baseline), and the samples left out of the loss."""

    def __init__(self, bands: DriftBands | None) -> None:
        self.bands = bands
        self.first_entropy: float | None = None
        self.verdicts: dict[int, str | None] = {}
        self.since = 0  # versions before this one (a fallback's) are not judged again
        self.left_out: dict[str, int] = {}

    def drifting(self, info: dict[str, Any]) -> str | None:
        """The problem when the last two judged versions were both out of band."""
        version = int(info.get("version", 0))
        if self.bands is None or "entropy" not in info or version < self.since or version in self.verdicts:
            return None
        if self.first_entropy is None:
            self.first_entropy = float(info["entropy"])
        self.verdicts[version] = drift_problem(info, self.first_entropy, self.bands)
        last = [self.verdicts[v] for v in sorted(self.verdicts)[-2:] if v >= self.since]
        return last[-1] if len(last) == 2 and all(last) else None

    def left_out_news(self, info: dict[str, Any]) -> list[str]:
        """A warning line the first time samples are left out of the loss, and when a new reason appears."""
        counts = info.get("left_out") or {}
        if not isinstance(counts, dict) or set(counts) <= set(self.left_out):
            self.left_out = dict(counts) if isinstance(counts, dict) else self.left_out
            return []
        self.left_out = dict(counts)
        line = left_out_text(self.left_out, int(info.get("samples_total", 0)) or sum(self.left_out.values()))
        return [line] if line else []

    def restart(self, version: int) -> None:
        """Judge only what comes after a fallback to ``version`` (the baseline entropy stays the start's)."""
        self.since = version


class _TaskQueue:
    """The training tasks, ``passes`` times over (None: for ever), as (pass, index, task)."""

    def __init__(self, tasks: Sequence[Any], passes: int | None) -> None:
        self.tasks, self.passes = list(tasks), passes
        self.next = 0  # position over all passes
        self.cleared = False

    def _total(self) -> float:
        return float("inf") if self.passes is None else self.passes * len(self.tasks)

    def __bool__(self) -> bool:
        return not self.cleared and bool(self.tasks) and self.next < self._total()

    def pop(self) -> tuple[int, int, Any]:
        p, i = divmod(self.next, len(self.tasks))
        self.next += 1
        return p, i, self.tasks[i]

    def clear(self) -> None:
        self.cleared = True

    def remaining_text(self) -> str:
        if not self:
            return "0"
        total = self._total()
        return "until the budget:" if total == float("inf") else str(int(total) - self.next)


def _notice(driver: Driver, message: str) -> None:
    """A line the user must see (not thinned out like progress)."""
    notice = getattr(driver, "notice", None)
    (notice or driver.show)(message)


def _val_metadata(tasks: Sequence[Any]) -> list[dict[str, Any]]:
    # A group of its own per validation rollout: the trainer never completes (so never trains on) such a group.
    return [{"group_id": f"val-{uuid.uuid4().hex}", "data_id": str(i)} for i in range(len(tasks))]


def wait_for_policy(driver: Driver, ok: Callable[[Policy], bool], timeout: float) -> Policy:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        policy = driver.latest_policy()
        if policy is not None and ok(policy):
            return policy
        if driver.stopping():
            break
        time.sleep(0.2)
    policy = driver.latest_policy()
    if policy is None:
        raise TimeoutError(f"no policy was published within {timeout:.0f}s: see the trainer's and the policy "
                           "server's logs")
    return policy


Critic = Callable[[str, float, Sequence[RolloutResult]], str]
POLICY_ENDPOINT = "policy"  # as a critic: the policy endpoint of the running stack, asked over the OpenAI API


class PromptSearch(Algorithm):
    """Publishes prompt templates instead of weights (the reference's APO, simplified): every candidate is
    published with the current LLM and scored by its validation reward; a ``critic`` (e.g. :func:`openai_critic`
    over any OpenAI-compatible endpoint, the policy endpoint included) proposes a new candidate from the best one
    for ``rounds`` rounds; the best template is published last and run on the training set.

    ``critic`` is a callable, an OpenAI-compatible base URL, or ``"policy"``: the stack's own policy endpoint
    (found when the search starts), asked for ``critic_model``."""

    name = "prompt-search"

    def __init__(self, candidates: Sequence[str], critic: Critic | str | None = None, rounds: int = 1,
                 critic_model: str = "tiny-policy", critic_max_tokens: int = 256) -> None:
        super().__init__()
        if not candidates:
            raise ValueError("PromptSearch needs at least one candidate template")
        self.candidates = list(candidates)
        self.critic_spec = critic
        self.critic_model, self.critic_max_tokens = critic_model, critic_max_tokens
        self.critic: Critic | None = self._openai_critic(critic) \
            if isinstance(critic, str) and critic != POLICY_ENDPOINT else critic if callable(critic) else None
        self.critic_errors: list[str] = []
        self.proposals: list[str] = []  # what the critic proposed, tried unless empty or already scored
        self.rounds = rounds
        self.scores: dict[str, float] = {}
        self.results: dict[str, list[RolloutResult]] = {}  # each template's validation rollouts, for the critic
        self.best: str | None = None

    def run(self, driver: Driver, train: Sequence[Any], val: Sequence[Any] | None) -> None:
        if self.critic_spec == POLICY_ENDPOINT:
            self.critic = self._policy_critic(driver)
        scored = val or train
        base = driver.latest_policy()
        llm = driver.resources(base.resources_id) if base else {}
        for k, template in enumerate(self._candidates(driver)):
            if driver.stopping():
                return
            rid = driver.publish({**llm, "prompt_template": PromptTemplate(template=template)})
            results = run_all(driver, scored, VAL, resources_id=rid)
            for r in results:
                self.history.add(r, k)
            self.scores[template], self.results[template] = mean_reward(results) or 0.0, results
            driver.show(f"template {k}: validation reward {self.scores[template]:.3f}: {template!r}")
        self.best = max(self.scores, key=lambda t: self.scores[t])
        rid = driver.publish({**llm, "prompt_template": PromptTemplate(template=self.best)})
        for r in run_all(driver, train, TRAIN, resources_id=rid):
            self.history.add(r, len(self.scores))

    def report(self) -> dict[str, Any]:
        return {"best_template": self.best, "template_scores": dict(self.scores),
                "proposals": list(self.proposals), "critic_errors": list(self.critic_errors)}

    def _policy_critic(self, driver: Driver) -> Critic:
        url = driver.service_info("policy-server").get("url")  # its health report names its bound URL
        if not url:
            raise RuntimeError("critic 'policy': no policy endpoint runs here (Trainer(serve_policy=False), or a "
                               "joined stack: give its URL)")
        return self._openai_critic(str(url))

    def _openai_critic(self, base_url: str) -> Critic:
        return openai_critic(base_url, self.critic_model, max_tokens=self.critic_max_tokens)

    def _candidates(self, driver: Driver) -> Any:
        yield from self.candidates
        for _ in range(self.rounds if self.critic else 0):
            best = max(self.scores, key=lambda t: self.scores[t])
            try:
                proposal = self.critic(best, self.scores[best], self.results[best]) if self.critic else best
            except Exception as exc:  # noqa: BLE001 (any client's error) the candidates scored so far still count
                self.critic_errors.append(f"{type(exc).__name__}: {exc}")
                driver.show(f"the critic failed, no proposal this round: {self.critic_errors[-1]}")
                continue
            self.proposals.append(proposal)
            if proposal and proposal not in self.scores:
                yield proposal


def openai_critic(base_url: str, model: str, api_key: str = "unused", max_tokens: int = 256) -> Critic:
    """A critic asking any OpenAI-compatible endpoint to improve the best template so far (in at most
    ``max_tokens``: the prompt and the answer must fit the model's context)."""

    def propose(template: str, score: float, _results: Sequence[RolloutResult]) -> str:
        import openai

        client = openai.OpenAI(base_url=base_url, api_key=api_key)
        answer = client.chat.completions.create(model=model, max_tokens=max_tokens, messages=[{
            "role": "user", "content": f"This prompt template scored {score:.3f} (0-1) on its tasks. Write an "
                                       f"improved template, keeping its {{placeholders}}. Template:\n{template}"}])
        return (answer.choices[0].message.content or "").strip()

    return propose
