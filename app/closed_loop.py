"""The main job: the closed loop of agent RL on the embedded stack.

Runners do a toy task with the current policy, their spans become triplets, the trainer learns from windows of
them and publishes each new version, and the next rollouts use it. Every part is its own process talking through
Kafka: the broker, the lifecycle processor, the span sink (ClickHouse), the triplet processor, the trainer and N
runners. This process only enqueues tasks (``group_size`` rollouts per task: a GRPO group), keeps a bounded
number in flight, shows progress, and reads the outcome back with SQL.
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from litstream.infra import clickhouse, health
from litstream.infra.kafka import read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.models import FINISHED
from litstream.schemas.policy import parse_policy_version
from litstream.streams.stateview import StateView
from litstream.workers.client import enqueue_rollout

from .demo import fresh_stack, spans_emitted_and_stored
from .stack import Stack

AGENT = "litstream.workers.policy_agent:toy_policy_agent"


@dataclass
class LoopDemoConfig:
    model: str = "tiny"  # tiny | smollm2
    steps: int = 60  # policy versions to train
    minutes: float = 5.0  # time budget for training
    runners: int = 2
    concurrency: int = 8  # agent slots per runner
    group_size: int = 8
    groups_per_step: int = 16
    in_flight: int | None = None  # rollouts enqueued and not yet finished; None: two training windows' worth
    max_staleness: int = 3
    lr: float = 1e-3
    epochs: int = 4
    entropy_coef: float = 0.03
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
    console = Console(stderr=True, quiet=quiet)
    t0 = time.monotonic()
    run_dir = settings.data_dir / "demo"
    banner = (f"[bold]litstream demo[/]: GRPO on the {cfg.model} policy, {cfg.runners} runner(s) x {cfg.concurrency} "
              f"slots, {cfg.groups_per_step} groups of {cfg.group_size} per step")
    with fresh_stack(settings, console, banner) as stack:
        settings = stack.settings
        stack.start("lifecycle", "process", "lifecycle")
        stack.start("span-sink", "process", "span-sink")
        stack.start("triplets", "process", "triplets")
        stack.start("trainer", "process", "trainer", "--policy", cfg.model, "--group-size", str(cfg.group_size),
                    "--groups-per-step", str(cfg.groups_per_step), "--max-staleness", str(cfg.max_staleness),
                    "--lr", str(cfg.lr), "--epochs", str(cfg.epochs), "--entropy-coef", str(cfg.entropy_coef),
                    "--max-steps", str(cfg.steps), "--seed", str(cfg.seed))
        for i in range(cfg.runners):
            stack.start(f"runner-{i}", "runner", "--agent", AGENT, "--concurrency", str(cfg.concurrency))
        stack.wait_ready("span-sink", "span-sink", key="inserted")
        stack.wait_ready("lifecycle", "lifecycle")
        stack.wait_ready("triplets", "triplets", key="triplets")
        stack.wait_ready("trainer", "trainer", key="version", timeout=600)  # SmolLM2 takes a while to load
        console.print("  lifecycle, span sink, triplet processor, trainer (policy-v0 published) and runners are up")

        rollouts, by_status = _drive(settings, stack, cfg, console)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the triplet processor finalizes an attempt once its spans settle
            if int((health.read(settings.data_dir, "triplets") or {}).get("attempts", 0)) >= rollouts:
                break
            time.sleep(0.3)

        spans_emitted, in_ch = spans_emitted_and_stored(settings)
        triplet_versions = _triplet_versions(settings)
        triplets = sum(triplet_versions.values())
        rows = clickhouse.query(settings.resolved_clickhouse_dsn, "SELECT resources_id, avg(reward), count() FROM spans FINAL "
                                     "WHERE reward IS NOT NULL GROUP BY resources_id").rows
        steps = _trainer_steps(run_dir)

    by_version: dict[int, float] = {}
    counts: dict[int, int] = {}
    for rid, mean, n in rows:
        v = parse_policy_version(rid)
        if v is not None:
            by_version[v], counts[v] = float(mean), int(n)
    by_version = dict(sorted(by_version.items()))
    counts = dict(sorted(counts.items()))
    plot = _plot(by_version, counts, steps, cfg.plot or run_dir / "reward_curve.png")
    return LoopDemoResult(versions=list(by_version), mean_reward_by_version=by_version, rollouts_by_version=counts,
                          rollouts=rollouts, by_status=by_status, spans_emitted=spans_emitted,
                          spans_in_clickhouse=in_ch, triplets=triplets, trainer_steps=steps,
                          seconds=time.monotonic() - t0, data_dir=str(run_dir), plot=plot,
                          extra={"triplets_by_version": triplet_versions})


def _drive(settings: Settings, stack: Stack, cfg: LoopDemoConfig, console: Console) -> tuple[int, dict[str, int]]:
    """Enqueue task groups, at most ``in_flight`` rollouts unfinished, until the trainer has made ``steps``
    versions or the time budget is spent; then let the rollouts in flight finish."""
    rng = random.Random(cfg.seed)
    events = EventProducer(settings, role="demo")
    from litstream.trainer import toy_task

    outstanding: set[str] = set()
    finished: dict[str, str] = {}
    in_flight = cfg.in_flight or 2 * cfg.groups_per_step * cfg.group_size
    deadline = time.monotonic() + cfg.minutes * 60
    try:
        with StateView(settings) as view, Progress(
            TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console,
        ) as progress:
            bar = progress.add_task("policy versions", total=cfg.steps)
            version = 0
            while version < cfg.steps and time.monotonic() < deadline:
                while len(outstanding) + cfg.group_size <= in_flight:
                    task = toy_task.make_task(rng)
                    group = f"g-{uuid.uuid4().hex[:12]}"
                    for _ in range(cfg.group_size):
                        ev = enqueue_rollout(events, task, mode="train", metadata={"group_id": group})
                        outstanding.add(ev.rollout_id)
                events.flush()
                time.sleep(0.2)
                _collect(view, outstanding, finished)
                info = health.read(settings.data_dir, "trainer") or {}
                version = int(info.get("version", 0))
                steps = _trainer_steps(settings.data_dir)
                reward = f"batch reward {steps[-1]['reward_mean']:.2f}" if steps else "waiting for the first window"
                progress.update(bar, completed=min(version, cfg.steps),
                                description=f"policy v{version}: {reward}; {len(finished)} rollouts done")
                _check_alive(stack)
            settle = time.monotonic() + 60
            while outstanding and time.monotonic() < settle:
                _collect(view, outstanding, finished)
                time.sleep(0.2)
    finally:
        events.flush()
    by_status: dict[str, int] = {}
    for status in finished.values():
        by_status[status] = by_status.get(status, 0) + 1
    if outstanding:
        by_status["unfinished"] = len(outstanding)
    return len(finished) + len(outstanding), by_status


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


def _collect(view: StateView, outstanding: set[str], finished: dict[str, str]) -> None:
    snaps = view.catch_up()
    for rid in list(outstanding):
        snap = snaps.get(rid)
        if snap is not None and snap.status in FINISHED:
            finished[rid] = snap.status
            outstanding.discard(rid)


def _trainer_steps(data_dir: Path) -> list[dict[str, Any]]:
    from litstream.trainer.service import read_metrics

    return read_metrics(data_dir)


def _check_alive(stack: Stack) -> None:
    for name, proc in stack.roles.items():
        if name == "trainer" and proc.proc.returncode == 0:
            continue  # it stops by itself after its last step
        if not proc.alive():
            raise RuntimeError(f"{name} exited with code {proc.proc.returncode}; see {proc.log_path}")


def _plot(by_version: dict[int, float], counts: dict[int, int], steps: list[dict[str, Any]],
          path: Path) -> str | None:
    if not by_version:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    versions = list(by_version)
    ax.plot(versions, [by_version[v] for v in versions], marker="o", label="mean reward of rollouts (ClickHouse)")
    if steps:
        ax.plot([s["version"] - 1 for s in steps], [s["reward_mean"] for s in steps], alpha=0.5, linestyle="--",
                label="mean reward of each training window")
    ax.set_xlabel("policy version that generated the rollouts")
    ax.set_ylabel("reward")
    top = max([*by_version.values(), *(s["reward_mean"] for s in steps)], default=1.0)
    ax.set_ylim(0, min(1.05, max(0.1, top * 1.25)))
    ax.set_title(f"GRPO closed loop: {sum(counts.values())} rollouts")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
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
    out.print(f"rollouts {result.rollouts} {result.by_status}   spans emitted {result.spans_emitted}   "
              f"in ClickHouse {result.spans_in_clickhouse}   triplets {result.triplets}   "
              f"took {result.seconds:.0f}s")
    if result.plot:
        out.print(f"reward curve: {result.plot}")
    if as_json:
        sys.stdout.write(json.dumps(result.summary()) + "\n")
