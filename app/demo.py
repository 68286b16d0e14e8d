"""The quick slice (``litstream demo --slice``): rollouts through every part of the pipeline, without training.

Starts the broker, creates the topics, runs the lifecycle processor, the span sink and a runner with the toy
arithmetic agent as separate processes (``roles.slice_roles``), enqueues rollouts, waits until every one is
finished, and reads the spans back from ClickHouse. The main job, the closed loop of agent RL (``litstream
demo``), is ``closed_loop.py``.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from litstream.infra import clickhouse
from litstream.infra.kafka import read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.models import FINISHED
from litstream.streams.stateview import StateView
from litstream.workers.client import enqueue_rollout
from litstream.workers.demo_agent import make_task

from .roles import slice_roles
from .stack import Stack


@dataclass
class DemoResult:
    rollouts: int
    by_status: dict[str, int]
    spans_emitted: int
    spans_in_clickhouse: int
    mean_reward: float | None
    seconds: float
    data_dir: str
    rows: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"rollouts": self.rollouts, "by_status": self.by_status, "spans_emitted": self.spans_emitted,
                "spans_in_clickhouse": self.spans_in_clickhouse, "mean_reward": self.mean_reward,
                "seconds": round(self.seconds, 2), "data_dir": self.data_dir}


@contextmanager
def fresh_stack(settings: Settings, console: Console, banner: str) -> Iterator[Stack]:
    """A demo's own embedded stack in ``<data_dir>/demo``: broker up and topics created, roles left to the caller.
    The embedded broker starts empty, so the directory (span store, checkpoints, health) is cleared first."""
    run_dir = settings.data_dir / "demo"
    shutil.rmtree(run_dir, ignore_errors=True)
    update: dict[str, object] = {"data_dir": run_dir, "clickhouse_dsn": None}
    if "broker_storage" not in settings.model_fields_set:
        # A demo starts from an empty directory each run: its log is thrown away at the end unless
        # LITSTREAM_BROKER_STORAGE=durable asks to keep it under the run's directory.
        update["broker_storage"] = "ephemeral"
    with Stack(settings.model_copy(update=update)) as stack:
        console.print(f"{banner}; data in {run_dir}")
        bootstrap = stack.start_broker()
        stack.create_topics()
        where = stack.broker.storage if stack.broker is not None else "?"
        console.print(f"  broker (Apache Kafka) on {bootstrap} (log {where}); topics created")
        yield stack


def run_demo(settings: Settings, rollouts: int = 12, concurrency: int = 4, timeout: float = 180.0,
             quiet: bool = False, seed: int = 0) -> DemoResult:
    console = Console(stderr=True, quiet=quiet)
    t0 = time.monotonic()
    run_dir = settings.data_dir / "demo"
    with fresh_stack(settings, console,
                     f"[bold]litstream demo[/]: {rollouts} rollouts, runner concurrency {concurrency}") as stack:
        settings = stack.settings
        stack.start_roles(slice_roles(concurrency))
        console.print("  lifecycle processor, span sink and runner are up")

        rng = random.Random(seed)
        events = EventProducer(settings, role="demo")
        ids = [enqueue_rollout(events, make_task(rng), mode="train").rollout_id for _ in range(rollouts)]
        events.flush()

        with StateView(settings) as view, Progress(
            TextColumn("  rollouts finished"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=quiet,
        ) as progress:
            bar = progress.add_task("finished", total=rollouts)
            deadline = time.monotonic() + timeout
            while True:
                snaps = view.catch_up()
                done = sum(1 for rid in ids if rid in snaps and snaps[rid].status in FINISHED)
                progress.update(bar, completed=done)
                if done == rollouts:
                    break
                _check_alive(stack)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {done}/{rollouts} rollouts finished within {timeout:.0f}s; "
                                       f"see the logs in {stack.log_dir}")
                time.sleep(0.3)
            snaps = dict(view.snapshots)

        spans_emitted, in_ch = spans_emitted_and_stored(settings)
        dsn = settings.resolved_clickhouse_dsn
        reward_rows = clickhouse.query(
            dsn, "SELECT rollout_id, any(reward) FROM spans FINAL WHERE reward IS NOT NULL GROUP BY rollout_id").rows
        rewards = {r[0]: r[1] for r in reward_rows}
        del events  # close our producer before the broker stops

    rows = []
    by_status: dict[str, int] = {}
    for rid in ids:
        s = snaps[rid]
        by_status[s.status] = by_status.get(s.status, 0) + 1
        rows.append({"rollout_id": rid, "status": s.status, "attempts": len(s.attempts),
                     "task": f"{s.input['a']} {s.input['op']} {s.input['b']}", "reward": rewards.get(rid)})
    mean = sum(v for v in rewards.values() if v is not None) / len(rewards) if rewards else None
    return DemoResult(rollouts, by_status, spans_emitted, in_ch, mean, time.monotonic() - t0, str(run_dir), rows)


def spans_emitted_and_stored(settings: Settings, timeout: float = 60.0) -> tuple[int, int]:
    """Spans on the topic, and in ClickHouse once the sink has caught up (it commits batch by batch)."""
    emitted = sum(1 for _ in read_to_end(settings, f"{settings.topic_prefix}.spans"))
    stored = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stored = int(clickhouse.query(settings.resolved_clickhouse_dsn, "SELECT count() FROM spans FINAL").rows[0][0])
        if stored >= emitted:
            break
        time.sleep(0.3)
    return emitted, stored


def _check_alive(stack: Stack) -> None:
    for name, proc in stack.roles.items():
        if not proc.alive():
            raise RuntimeError(f"{name} exited with code {proc.proc.returncode}; see {proc.log_path}")


def print_result(result: DemoResult, as_json: bool) -> None:
    console = Console()
    table = Table(title="Rollouts")
    for col in ("rollout_id", "task", "status", "attempts", "reward"):
        table.add_column(col)
    for r in result.rows:
        table.add_row(r["rollout_id"], r["task"], r["status"], str(r["attempts"]),
                      "" if r["reward"] is None else f"{r['reward']:.1f}")
    if not as_json:
        console.print(table)
        reward = "n/a" if result.mean_reward is None else f"{result.mean_reward:.2f}"
        console.print(f"spans emitted: {result.spans_emitted}   spans in ClickHouse: {result.spans_in_clickhouse}   "
                      f"mean reward: {reward}   took {result.seconds:.1f}s")
    else:
        Console(stderr=True).print(table)
        sys.stdout.write(json.dumps(result.summary()) + "\n")
