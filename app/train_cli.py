"""``litstream train``: Trainer.fit from the command line, over JSONL or Parquet datasets."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from litstream.infra.settings import Settings
from litstream.trainer.algorithm import GRPO, Algorithm, Baseline, PromptSearch

EXAMPLE = """\b
Examples:
  litstream train --agent examples.copy_agent:copy_agent --train examples/data/copy_train.jsonl \\
                  --val examples/data/copy_val.jsonl --passes 4 --json
  litstream train --agent my_agents:support_bot --train tasks.parquet --algorithm baseline
  litstream train --agent my_agents:support_bot --train t.jsonl --val v.jsonl --algorithm prompt-search \\
                  --template "Answer briefly: {question}" --template "Think, then answer: {question}"
  litstream train --gateway --runners 0 --train t.jsonl     # Agent Lightning's runners run the rollouts
"""


def _algorithm(name: str, opts: dict[str, Any]) -> Algorithm:
    if name == "baseline":
        return Baseline()
    if name == "prompt-search":
        if not opts["template"]:
            raise click.UsageError("--algorithm prompt-search needs at least one --template")
        return PromptSearch(opts["template"], critic=opts["critic_url"], rounds=opts["rounds"],
                            critic_model=opts["critic_model"], critic_max_tokens=opts["critic_max_tokens"])
    return GRPO(model=opts["model"], group_size=opts["group_size"], groups_per_step=opts["groups_per_step"],
                passes=opts["passes"], val_every=opts["val_every"], lr=opts["lr"], ppo_epochs=opts["epochs"],
                entropy_coef=opts["entropy_coef"], max_staleness=opts["max_staleness"], seed=opts["seed"])


@click.command(epilog=EXAMPLE)
@click.option("--agent", default=None, help="module:attr of the agent (a LitAgent or a function taking task, llm); "
                                          "not needed with --gateway --runners 0.")
@click.option("--train", "train_path", required=True, type=click.Path(path_type=Path),
              help="Training tasks: JSONL (one JSON value a line) or Parquet (one task a row).")
@click.option("--val", "val_path", type=click.Path(path_type=Path), default=None, help="Validation tasks, as --train.")
@click.option("--algorithm", type=click.Choice(["grpo", "baseline", "prompt-search"]), default="grpo",
              show_default=True)
@click.option("--model", type=click.Choice(["tiny", "smollm2"]), default="tiny", show_default=True,
              help="The policy the server answers with (and GRPO trains).")
@click.option("--runners", default=1, show_default=True, help="Runner processes.")
@click.option("--concurrency", default=32, show_default=True, help="Agent slots per runner.")
@click.option("--passes", default=1, show_default=True, help="GRPO: passes over the training set.")
@click.option("--group-size", default=8, show_default=True, help="GRPO: rollouts per task.")
@click.option("--groups-per-step", default=16, show_default=True, help="GRPO: groups per training step.")
@click.option("--val-every", default=5, show_default=True, help="GRPO: validate every N policy versions.")
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--epochs", default=4, show_default=True, help="GRPO: optimizer steps per window.")
@click.option("--entropy-coef", default=0.03, show_default=True)
@click.option("--max-staleness", default=2, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--template", multiple=True, help="prompt-search: a candidate prompt template (repeatable).")
@click.option("--rounds", default=1, show_default=True, help="prompt-search: critic proposals to try.")
@click.option("--critic-url", default=None, help="prompt-search: an OpenAI-compatible endpoint proposing templates, "
                                                "or 'policy' for the run's own policy endpoint.")
@click.option("--critic-model", default="tiny-policy", show_default=True)
@click.option("--critic-max-tokens", default=256, show_default=True,
              help="prompt-search: the critic's answer length (prompt and answer must fit its context).")
@click.option("--resume", is_flag=True, help="Go on from the checkpoints of the last run in this data dir.")
@click.option("--join", is_flag=True, help="Use the Kafka of the settings (a running stack) instead of a fresh "
                                           "embedded one; start runners there with `litstream runner --agent`.")
@click.option("--gateway", "with_gateway", is_flag=True,
              help="Also serve the gateway (Agent Lightning's store API and OTLP) for Agent Lightning's own runners: "
                   "run them with AGL_CURRENT_ROLE=runner AGL_SERVER_HOST/AGL_SERVER_PORT of the URL it prints.")
@click.option("--gateway-port", default=0, show_default=True, help="The gateway's port (0: any free port).")
@click.option("--json", "as_json", is_flag=True, help="End with one JSON line for scripts.")
def train(agent: str | None, train_path: Path, val_path: Path | None, algorithm: str, runners: int,
          concurrency: int, resume: bool, join: bool, with_gateway: bool, gateway_port: int, as_json: bool,
          **opts: Any) -> None:
    """Train an agent on a dataset (Trainer.fit): GRPO on the policy, a baseline run, or a prompt search.

    Brings up the embedded stack (broker, pipeline, policy server publishing itself, the trainer, runners with
    the agent), validates on version 0 and every --val-every versions, and prints the reward per version.
    Ctrl-C stops cleanly: checkpoints and the event log keep what was done.
    """
    from .trainer import Trainer, load_dataset

    err = Console(stderr=True)
    if agent is None and not (with_gateway and runners == 0):
        raise click.UsageError("--agent is needed, unless Agent Lightning's runners run the rollouts "
                               "(--gateway --runners 0)")
    try:
        train_set = load_dataset(train_path)
        val_set = load_dataset(val_path) if val_path else None
        trainer = Trainer(algorithm=_algorithm(algorithm, opts), n_runners=runners, concurrency=concurrency,
                          model=opts["model"], settings=Settings(), join=join, resume=resume,
                          gateway=with_gateway, gateway_port=gateway_port)
        summary = trainer.fit(agent, train_set, val_set)
    except (ValueError, RuntimeError, TimeoutError, ConnectionError, LookupError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        sys.exit(1)
    out = Console(stderr=as_json)
    table = Table(title=f"Reward by policy version ({summary.algorithm})")
    for col in ("version", "train", "validation"):
        table.add_column(col, justify="right")
    for v in summary.versions:
        tr, va = summary.train_reward_by_version.get(v), summary.val_reward_by_version.get(v)
        table.add_row(f"v{v}", f"{tr:.3f}" if tr is not None else "", f"{va:.3f}" if va is not None else "")
    out.print(table)
    out.print(f"rollouts {summary.rollouts} {summary.by_status}; took {summary.seconds:.0f}s"
              + ("; interrupted" if summary.interrupted else ""))
    if as_json:
        sys.stdout.write(json.dumps(summary.as_dict()) + "\n")
