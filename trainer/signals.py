"""What a run's numbers say, as pure functions (no torch, no Kafka): whether GRPO has a signal to learn from,
how sure a validation is, which validated version is best and when validation has stopped improving.

* **Signal.** GRPO learns only from groups whose rewards differ: a group whose members all scored the same
  (all 0, or all 1) has zero advantage. :func:`window_signal` summarises one window of groups (the share of flat
  groups, the reward spread within groups); :func:`missing_signal` turns a run of windows without signal into
  one line saying what to try.
* **Validation.** :func:`val_estimate` gives the mean over tasks (each task weighs the same, however many
  samples it has) and its standard error from the spread of the per-task means, so several samples of a task
  count as one task, not as independent evidence. :func:`val_warning` says when two validations of this size
  cannot tell a change from noise.
* **Best version and early stop.** :func:`best_version` and :func:`plateaued` read the validations so far.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CHECK_REWARDS = "check the reward on a few rollouts (`litstream rollout show <rollout id>`)"


@dataclass(frozen=True)
class WindowSignal:
    """One window of groups (one policy version's groups, when GRPO submits in waves)."""

    version: int
    groups: int
    flat: int  # groups whose rewards were all equal: no advantage, no gradient
    reward_mean: float
    spread: float  # mean over groups of the within-group standard deviation of the rewards
    all_zero: bool  # every reward of the window was 0
    all_one: bool  # every reward of the window was 1 (or more)

    @property
    def flat_share(self) -> float:
        return self.flat / self.groups if self.groups else 1.0

    def text(self) -> str:
        return (f"flat groups {self.flat}/{self.groups} ({self.flat_share:.0%}), reward spread {self.spread:.3f}, "
                f"mean {self.reward_mean:.3f}")


def window_signal(version: int, groups: Sequence[Sequence[float]]) -> WindowSignal:
    """The signal of one window: ``groups`` holds each group's rewards (groups of fewer than 2 count as flat)."""
    flat = 0
    spreads: list[float] = []
    rewards: list[float] = []
    for g in groups:
        rs = [float(r) for r in g]
        rewards.extend(rs)
        if len(rs) < 2 or max(rs) == min(rs):
            flat += 1
        mean = sum(rs) / len(rs) if rs else 0.0
        spreads.append(math.sqrt(sum((r - mean) ** 2 for r in rs) / len(rs)) if rs else 0.0)
    return WindowSignal(version=version, groups=len(groups), flat=flat,
                        reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
                        spread=sum(spreads) / len(spreads) if spreads else 0.0,
                        all_zero=bool(rewards) and all(r == 0.0 for r in rewards),
                        all_one=bool(rewards) and all(r >= 1.0 for r in rewards))


def missing_signal(windows: Sequence[WindowSignal], over: int = 5, example_rollout: str | None = None,
                   ) -> str | None:
    """One line when each of the last ``over`` windows had no signal (every reward 0, or every group flat),
    naming what to try; None while there is signal, or when every reward was 1 (the task is solved: nothing is
    wrong, there is just nothing left to learn)."""
    recent = list(windows)[-over:]
    if len(recent) < over or any(w.flat < w.groups for w in recent) or all(w.all_one for w in recent):
        return None
    check = CHECK_REWARDS.replace("<rollout id>", example_rollout) if example_rollout else CHECK_REWARDS
    span = f"v{recent[0].version}-v{recent[-1].version}"
    if all(w.all_zero for w in recent):
        what = f"every reward was 0 for {over} windows ({span})"
    else:
        what = f"in every group of the last {over} windows ({span}) all rewards were equal"
    return (f"no learning signal: {what}, and GRPO learns only from groups whose rewards differ. Try a model "
            f"that can reach the task, reward shaping (partial credit), a bigger group (--group-size), a warmer "
            f"temperature (--temperature), and {check}.")


@dataclass(frozen=True)
class ValEstimate:
    """A validation: the mean over tasks, its standard error, and its size (tasks x samples per task)."""

    mean: float
    se: float  # inf when it cannot be estimated (a single task)
    tasks: int
    samples: int  # samples per task (the smallest, when they differ)

    def text(self) -> str:
        se = "n/a" if math.isinf(self.se) else f"{self.se:.3f}"
        return f"{self.mean:.3f} ± {se} ({self.tasks} tasks × {self.samples})"


def val_estimate(rewards_by_task: Mapping[Any, Sequence[float]]) -> ValEstimate | None:
    """Mean and standard error over tasks from each task's rewards (None when there are none). The standard error
    is that of the mean of the per-task means: the samples of one task share its difficulty, so they are not
    independent evidence about the policy."""
    means = [sum(rs) / len(rs) for rs in rewards_by_task.values() if rs]
    if not means:
        return None
    n = len(means)
    mean = sum(means) / n
    se = math.sqrt(sum((m - mean) ** 2 for m in means) / (n - 1) / n) if n > 1 else math.inf
    return ValEstimate(mean=mean, se=se, tasks=n, samples=min(len(rs) for rs in rewards_by_task.values() if rs))


MIN_VAL_TASKS = 20
NOISE_Z = 1.96 * math.sqrt(2.0)  # two validations of the same policy differ by less than this many SE, 95% of the time


def noise_band(est: ValEstimate) -> float:
    """How far apart two validations of this size can land by chance alone (95%)."""
    return NOISE_Z * est.se


def val_warning(est: ValEstimate, resolution: float = 0.1) -> str | None:
    """A line when the validation set is too small to tell a change of ``resolution`` from noise, or has fewer
    than MIN_VAL_TASKS tasks (whose spread says little about the next task); None when it is large enough."""
    band = noise_band(est)
    size = f"validation has {est.tasks} task(s) × {est.samples} sample(s)"
    if math.isinf(band):
        return f"{size}: one task gives no error estimate. Use at least {MIN_VAL_TASKS} validation tasks."
    if band > resolution:
        return (f"{size}, standard error {est.se:.3f}: two validations of the same policy can differ by up to "
                f"{band:.2f} by chance, so a smaller change cannot be told from noise. Use more validation tasks "
                f"(at least {MIN_VAL_TASKS}) or sample each several times (--val-samples).")
    if est.tasks < MIN_VAL_TASKS:
        return (f"{size}: with fewer than {MIN_VAL_TASKS} tasks its standard error ({est.se:.3f}) says little "
                f"about tasks it has not seen; use more validation tasks unless these are all there are.")
    return None


def best_version(vals: Mapping[int, ValEstimate | float]) -> int | None:
    """The validated version with the highest mean (the later one on a tie: it trained longer at that level)."""
    if not vals:
        return None
    return max(vals, key=lambda v: (_mean(vals[v]), v))


def plateaued(vals: Mapping[int, ValEstimate | float], patience: int, min_delta: float = 0.0) -> bool:
    """True when none of the last ``patience`` validations beat the best before them by more than
    ``min_delta``: validation has stopped improving."""
    if patience < 1 or len(vals) <= patience:
        return False
    order = sorted(vals)
    before = max(_mean(vals[v]) for v in order[:-patience])
    return all(_mean(vals[v]) <= before + min_delta for v in order[-patience:])


def _mean(x: ValEstimate | float) -> float:
    return x.mean if isinstance(x, ValEstimate) else float(x)


def lr_factor(step: int, schedule: str, total_steps: int | None, warmup_steps: int = 0,
              min_ratio: float = 0.1) -> float:
    """The learning rate's multiplier at optimizer ``step`` (0-based): a linear warm-up over ``warmup_steps``,
    then ``constant``, or a ``cosine`` / ``linear`` decay to ``min_ratio`` at ``total_steps`` (held there after)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or not total_steps:
        return 1.0
    span = max(1, total_steps - warmup_steps)
    t = min(1.0, max(0, step - warmup_steps) / span)
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * t
    raise ValueError(f"unknown learning-rate schedule {schedule!r} (constant | cosine | linear)")


# --- a degrading run ----------------------------------------------------------------------------------------

TRY_WHEN_DEGRADING = ("try a lower learning rate (--lr), check that the agent's calls sample the way they are "
                      "scored (the left-out counts in the progress line), or a bigger group (--group-size)")


@dataclass(frozen=True)
class DriftBands:
    """Where a pretrained policy's step statistics stay while it learns, as multiples of the first step's
    entropy and as absolute bounds. Outside them the policy is being damaged: measured on SmolLM2-135M, samples
    scored at another temperature than they were drawn at clipped most tokens and turned answers into word salad
    within ten versions, its entropy rising with them."""

    entropy_low: float = 0.05  # the policy collapsed onto a few tokens
    entropy_high: float = 3.0  # its samples turn to noise
    kl_high: float = 1.0  # nats per token from the starting policy (k3 estimate)
    clip_high: float = 0.3  # share of tokens clipped: the samples' log-probs are not the policy's


def drift_problem(step: Mapping[str, float], first_entropy: float | None, bands: DriftBands) -> str | None:
    """What is out of band in one step's statistics (``entropy``, ``kl_start``, ``clip_frac``), None if all
    is well."""
    problems = []
    entropy = step.get("entropy")
    if entropy is not None and first_entropy:
        ratio = entropy / first_entropy
        if ratio > bands.entropy_high or ratio < bands.entropy_low:
            problems.append(f"entropy {entropy:.3f} is {ratio:.2f}x the first step's")
    kl = step.get("kl_start")
    if kl is not None and kl > bands.kl_high:
        problems.append(f"KL to the starting policy {kl:.3f} > {bands.kl_high:g}")
    clip = step.get("clip_frac")
    if clip is not None and clip > bands.clip_high:
        problems.append(f"{clip:.0%} of tokens clipped > {bands.clip_high:.0%}")
    return "; ".join(problems) or None


def validation_falling(vals: Mapping[int, ValEstimate | float], since: int = 0) -> str | None:
    """A line when the last two validations (of versions >= ``since``) each fell below the one before and the
    last is below the best: the policy is getting worse, not wobbling."""
    order = sorted(v for v in vals if v >= since)
    if len(order) < 3:
        return None
    a, b, c = (_mean(vals[v]) for v in order[-3:])
    best = best_version({v: vals[v] for v in vals})
    if not (c < b < a) or best is None or c >= _mean(vals[best]):
        return None
    return (f"validation fell twice in a row: v{order[-3]} {a:.3f} -> v{order[-2]} {b:.3f} -> v{order[-1]} "
            f"{c:.3f} (best v{best} {_mean(vals[best]):.3f})")
