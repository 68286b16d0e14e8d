"""The main job: the closed loop of agent RL on the embedded stack.

Runners do a toy task with the current policy, their spans become triplets, the trainer learns from windows of
them and publishes each new version, and the next rollouts use it. Every part is its own process talking through
Kafka: the broker, the lifecycle processor, the span sink (ClickHouse), the triplet processor, the trainer and N
runners. This process only enqueues tasks (``group_size`` rollouts per task: a GRPO group), keeps a bounded
number in flight, shows progress, and reads the outcome back with SQL. It runs as ``litstream demo``, through
:class:`~litstream.app.fit.Trainer`; the quick slice without training (``litstream demo --slice``) is
``demo.py``.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from litstream.infra import clickhouse, health
from litstream.infra.kafka import read_to_end
from litstream.infra.settings import Settings
from litstream.schemas.policy_versions import parse_policy_version
from litstream.trainer import toy_task
from litstream.trainer.algorithm import GRPO, History

from .demo import spans_emitted_and_stored
from .fit import Trainer, outcome_lines

AGENT = "litstream.workers.policy_agent:toy_policy_agent"


@dataclass
class LoopDemoConfig:
    model: str = "tiny"  # tiny | smollm2
    steps: int = 150  # policy versions to train at most
    # A time cap: the run usually ends before, when validation stops improving (the cap is for a loaded machine)
    minutes: float = 15.0
    # One runner process with many slots: its policy engine samples concurrent calls as one batch, and on
    # 2 cores a second process only adds a second copy of the model competing for them.
    runners: int = 1
    concurrency: int = 64  # agent slots per runner
    group_size: int = 8
    groups_per_step: int = 16
    in_flight: int | None = None  # rollouts enqueued and not yet finished; None: two training windows' worth
    max_staleness: int = 2
    lr: float = 1e-3
    epochs: int = 4
    entropy_coef: float = 0.03
    entropy_fade: bool = True  # the bonus fades as the window's mean reward nears 1 (docs/training.md)
    lr_by_signal: bool = True  # each step's learning rate times the share of groups with signal (docs/training.md)
    lr_schedule: str = "constant"
    # Validation: every distinct toy task (4 letters x 2 counts) sampled val_samples times, every val_every
    # versions; the run stops after `patience` validations without a new best and publishes the best version.
    val_every: int = 5
    val_samples: int = 8
    patience: int | None = 3
    # One window of rollouts per published version, pinned to it: each sample is trained exactly one version
    # after the one that made it (measured: samples two versions old learned several times slower).
    waves: bool = True
    seed: int = 0
    plot: Path | None = None  # reward-curve PNG (default <run dir>/reward_curve.png)


@dataclass
class LoopDemoResult:
    versions: list[int]
    mean_reward_by_version: dict[int, float]
    rollouts_by_version: dict[int, int]
    rollouts: int
    by_status: dict[str, int]
    spans_emitted: int
    spans_in_clickhouse: int
    triplets: int
    trainer_steps: list[dict[str, Any]]
    seconds: float
    data_dir: str
    plot: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"versions": self.versions,
                "mean_reward_by_version": {str(v): round(r, 4) for v, r in self.mean_reward_by_version.items()},
                "rollouts": self.rollouts, "by_status": self.by_status, "spans_emitted": self.spans_emitted,
                "spans_in_clickhouse": self.spans_in_clickhouse, "triplets": self.triplets,
                "trainer_steps": len(self.trainer_steps), "seconds": round(self.seconds, 1),
                "reward_curve": self.plot, "data_dir": self.data_dir, **self.extra}


def run_closed_loop(settings: Settings, cfg: LoopDemoConfig, quiet: bool = False) -> LoopDemoResult:
    """The demo as one use of :class:`~litstream.app.fit.Trainer`: GRPO over a dataset of toy tasks, the
    agent running the trained policy in-process (no policy server), stopped after ``steps`` versions or
    ``minutes``; the outcome is read back from the spans (ClickHouse) and the triplets topic."""
    t0 = time.monotonic()
    run_dir = settings.data_dir / "demo"
    rng = random.Random(cfg.seed)
    tasks = [toy_task.make_task(rng) for _ in range(max(1, cfg.steps) * cfg.groups_per_step * 2)]
    val = [{"letter": letter, "count": n} for letter in toy_task.LETTERS for n in range(1, toy_task.MAX_COUNT + 1)]
    algorithm = GRPO(model=cfg.model, group_size=cfg.group_size, groups_per_step=cfg.groups_per_step,
                     max_staleness=cfg.max_staleness, lr=cfg.lr, ppo_epochs=cfg.epochs,
                     entropy_coef=cfg.entropy_coef, entropy_fade=cfg.entropy_fade, lr_schedule=cfg.lr_schedule,
                     lr_by_signal=cfg.lr_by_signal,
                     in_flight=cfg.in_flight, seed=cfg.seed, window_seconds=None, max_versions=cfg.steps,
                     minutes=cfg.minutes, val_every=cfg.val_every if cfg.val_samples else 0,
                     val_samples=cfg.val_samples, patience=cfg.patience, pin_versions=True, waves=cfg.waves)
    outcome: dict[str, Any] = {}
    trainer = Trainer(algorithm=algorithm, n_runners=cfg.runners, concurrency=cfg.concurrency, model=cfg.model,
                      settings=settings, quiet=quiet, serve_policy=False, run_name="demo",
                      on_finish=lambda s: outcome.update(_outcome(s, algorithm.history.rollouts)))
    summary = trainer.fit(AGENT, tasks, val if cfg.val_samples else None)
    by_version, counts = train_reward_by_version(outcome.get("rows", []), algorithm.val_ids)
    if not by_version:  # interrupted: nothing read back from ClickHouse; the driver saw the rewards too
        by_version = History.means(algorithm.history.train)
        counts = {v: len(rs) for v, rs in sorted(algorithm.history.train.items())}
    steps = _trainer_steps(run_dir)
    vals = {v: (e.mean, e.se) for v, e in algorithm.val_estimates.items()}
    plot = _plot(by_version, counts, steps, cfg.plot or run_dir / "reward_curve.png", vals, algorithm.best)
    triplet_versions = outcome.get("triplet_versions", {})
    last3 = [by_version[v] for v in list(by_version)[-3:]]
    return LoopDemoResult(versions=list(by_version), mean_reward_by_version=by_version, rollouts_by_version=counts,
                          rollouts=summary.rollouts, by_status=summary.by_status,
                          spans_emitted=outcome.get("spans_emitted", 0),
                          spans_in_clickhouse=outcome.get("spans_in_clickhouse", 0),
                          triplets=sum(triplet_versions.values()), trainer_steps=steps,
                          seconds=time.monotonic() - t0, data_dir=str(run_dir), plot=plot,
                          extra={"triplets_by_version": triplet_versions,
                                 "last3_mean_reward": round(sum(last3) / len(last3), 4) if last3 else None,
                                 "interrupted": summary.interrupted, **summary.extra})


def _outcome(settings: Settings, rollouts: int) -> dict[str, Any]:
    """Read back, while the stack still runs: spans emitted and stored, triplets, reward by version."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the triplet processor finalizes an attempt once its spans settle
        if int((health.read(settings.data_dir, "triplets") or {}).get("attempts", 0)) >= rollouts:
            break
        time.sleep(0.3)
    spans_emitted, in_ch = spans_emitted_and_stored(settings)
    rows = clickhouse.query(settings.resolved_clickhouse_dsn, "SELECT rollout_id, any(resources_id), avg(reward) FROM "
                            "spans FINAL WHERE reward IS NOT NULL GROUP BY rollout_id").rows
    return {"spans_emitted": spans_emitted, "spans_in_clickhouse": in_ch, "rows": rows,
            "triplet_versions": _triplet_versions(settings)}


def train_reward_by_version(rows: list[Any], val_ids: set[str]) -> tuple[dict[int, float], dict[int, int]]:
    """Mean reward and count of the training rollouts per policy version, from (rollout id, resources id, reward)
    rows; validation rollouts are left out."""
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for rollout_id, resources_id, reward in rows:
        v = parse_policy_version(resources_id)
        if v is None or rollout_id in val_ids:
            continue
        sums[v] = sums.get(v, 0.0) + float(reward)
        counts[v] = counts.get(v, 0) + 1
    return ({v: sums[v] / counts[v] for v in sorted(sums)}, dict(sorted(counts.items())))


def _triplet_versions(settings: Settings) -> dict[str, int]:
    """Triplets on the topic by the policy version that generated them."""
    from litstream.schemas.codec import default_codec
    from litstream.schemas.events import TripletEmitted

    codec = default_codec(settings.schema_registry_url)
    counts: dict[str, int] = {}
    for msg in read_to_end(settings, f"{settings.topic_prefix}.triplets"):
        t = codec.decode_as(msg.value(), TripletEmitted)
        counts[str(t.policy_version)] = counts.get(str(t.policy_version), 0) + 1
    return counts


def _trainer_steps(data_dir: Path) -> list[dict[str, Any]]:
    from litstream.trainer.process import read_metrics

    return read_metrics(data_dir)


TARGET_REWARD = 0.8  # the demo's goal: this mean reward within its 5 minutes


def _first_version_at(by_version: dict[int, float], level: float) -> int | None:
    return next((v for v, r in by_version.items() if r >= level), None)


def _minutes_to_version(steps: list[dict[str, Any]], version: int) -> float | None:
    """Minutes from the trainer's start (its first wait began) to the publication of ``version``."""
    if not steps or version == 0:
        return None
    start = steps[0]["time"] - steps[0].get("wait_s", 0.0)
    done = next((s["time"] for s in steps if s["version"] == version), None)
    return (done - start) / 60 if done is not None else None


def _plot(by_version: dict[int, float], counts: dict[int, int], steps: list[dict[str, Any]],
          path: Path, vals: dict[int, tuple[float, float]] | None = None,
          best: dict[str, Any] | None = None) -> str | None:
    if not by_version:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    versions = list(by_version)
    ax.plot(versions, [by_version[v] for v in versions], marker="o",
            label="mean reward of training rollouts (ClickHouse)")
    if steps:
        ax.plot([s["version"] - 1 for s in steps], [s["reward_mean"] for s in steps], alpha=0.5, linestyle="--",
                label="mean reward of each training window")
    if vals:
        vs = sorted(vals)
        ax.errorbar(vs, [vals[v][0] for v in vs], yerr=[1.96 * vals[v][1] if vals[v][1] != float("inf") else 0
                                                          for v in vs],
                    fmt="s", color="tab:green", markersize=4, capsize=2, label="validation (95% interval)")
    if best is not None:
        bv = int(best["version"])
        ax.axvline(bv, color="tab:red", linewidth=1, alpha=0.7)
        ax.plot([bv], [best["validation"]], marker="*", color="tab:red", markersize=14, linestyle="none",
                label=f"best validated: v{bv} ({best['validation']:.3f}), published at the end")
    ax.set_xlabel("policy version that generated the rollouts")
    ax.set_ylabel("reward")
    top = max([*by_version.values(), *(s["reward_mean"] for s in steps),
               *(m + 1.96 * se for m, se in (vals or {}).values() if se != float("inf"))], default=1.0)
    ax.set_ylim(0, min(1.1, max(0.1, top * 1.25)))
    ax.axhline(TARGET_REWARD, color="grey", linewidth=0.8, linestyle=":")
    reached = _first_version_at(by_version, TARGET_REWARD)
    when = _minutes_to_version(steps, reached) if reached is not None else None
    goal = (f"; {TARGET_REWARD} reached at v{reached}" + (f", {when:.1f} min into training" if when else "")
            if reached is not None else "")
    ax.set_title(f"GRPO closed loop: {sum(counts.values()):,} rollouts{goal}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def print_result(result: LoopDemoResult, as_json: bool) -> None:
    out = Console(stderr=as_json)
    table = Table(title="Mean reward by policy version (from the spans in ClickHouse)")
    for col in ("version", "rollouts", "mean reward", ""):
        table.add_column(col, justify="right" if col != "" else "left")
    for v, r in result.mean_reward_by_version.items():
        table.add_row(f"v{v}", str(result.rollouts_by_version.get(v, 0)), f"{r:.3f}", "#" * round(r * 40))
    out.print(table)
    extra = result.extra
    if extra.get("last3_mean_reward") is not None:
        out.print(f"mean reward of the last three versions: {extra['last3_mean_reward']:.3f}")
    for line in outcome_lines(extra):
        out.print(line)
    if extra.get("interrupted"):
        out.print("interrupted: stopped on request (Ctrl-C or SIGTERM); the table shows what was done")
    out.print(f"rollouts {result.rollouts} {result.by_status}   spans emitted {result.spans_emitted}   "
              f"in ClickHouse {result.spans_in_clickhouse}   triplets {result.triplets}   "
              f"took {result.seconds:.0f}s")
    if result.plot:
        out.print(f"reward curve: {result.plot}")
    if as_json:
        sys.stdout.write(json.dumps(result.summary()) + "\n")
