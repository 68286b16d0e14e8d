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
from litstream.trainer.defaults import SMOLLM2, TINY
from litstream.trainer.rft import RftConfig

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
    if opts["warm_start"] and name != "grpo":
        raise click.UsageError("--warm-start starts GRPO's version 0; --algorithm " + name + " trains no policy")
    if name == "baseline":
        return Baseline()
    if name == "prompt-search":
        if not opts["template"]:
            raise click.UsageError("--algorithm prompt-search needs at least one --template")
        return PromptSearch(opts["template"], critic=opts["critic_url"], rounds=opts["rounds"],
                            critic_model=opts["critic_model"], critic_max_tokens=opts["critic_max_tokens"])
    return GRPO(model=opts["model"], group_size=opts["group_size"], groups_per_step=opts["groups_per_step"],
                passes=opts["passes"], minutes=opts["minutes"], max_versions=opts["max_versions"],
                val_every=opts["val_every"], val_samples=opts["val_samples"],
                patience=opts["patience"] or None, lr=opts["lr"], lr_schedule=opts["lr_schedule"],
                ppo_epochs=opts["epochs"], entropy_coef=opts["entropy_coef"], temperature=opts["temperature"],
                train_top_layers=opts["train_top_layers"], lora_rank=opts["lora_rank"],
                max_tokens=opts["max_tokens"], max_staleness=opts["max_staleness"], seed=opts["seed"],
                trajectories=opts["trajectories"], warm_start=opts["warm_start"],
                rft=RftConfig(min_reward=opts["warm_start_min_reward"]))


def _per_model(field: str, fmt: str = "{}") -> str:
    """The defaults of both named policies, for --help."""
    return (f"(default per model: tiny {fmt.format(getattr(TINY, field))}, smollm2 and other Hugging Face "
            f"models {fmt.format(getattr(SMOLLM2, field))})")


@click.command(epilog=EXAMPLE)
@click.option("--agent", default=None, help="module:attr of the agent (a LitAgent or a function taking task, llm); "
                                          "not needed with --gateway --runners 0.")
@click.option("--train", "train_path", required=True, type=click.Path(path_type=Path),
              help="Training tasks: JSONL (one JSON value a line) or Parquet (one task a row).")
@click.option("--val", "val_path", type=click.Path(path_type=Path), default=None, help="Validation tasks, as --train.")
@click.option("--algorithm", type=click.Choice(["grpo", "baseline", "prompt-search"]), default="grpo",
              show_default=True)
@click.option("--model", default="tiny", show_default=True,
              help="The policy the server answers with (and GRPO trains): tiny (a 0.5M byte-level model that learns "
                   "the toy task from scratch), smollm2 (SmolLM2-135M-Instruct, pretrained), or a directory holding "
                   "a Hugging Face causal LM. Each brings its own defaults for the options marked 'per model'.")
@click.option("--runners", default=1, show_default=True, help="Runner processes.")
@click.option("--concurrency", default=32, show_default=True, help="Agent slots per runner.")
@click.option("--passes", type=int, default=None,
              help="GRPO: passes over the training set. Without --passes, --minutes and --max-versions, the run "
                   f"goes over the set again and again for a first-run budget {_per_model('minutes', '{:g} min')} "
                   f"or {TINY.max_versions} / {SMOLLM2.max_versions} versions; with any of them, only the bounds "
                   "given apply. Either way it stops early once validation stops improving (--patience).")
@click.option("--minutes", type=float, default=None, help="GRPO: stop submitting after this long.")
@click.option("--max-versions", type=int, default=None, help="GRPO: stop after this many policy versions.")
@click.option("--group-size", type=int, default=None, help=f"GRPO: rollouts per task {_per_model('group_size')}.")
@click.option("--groups-per-step", type=int, default=None,
              help=f"GRPO: groups per training step {_per_model('groups_per_step')}.")
@click.option("--val-every", default=5, show_default=True, help="GRPO: validate every N policy versions.")
@click.option("--val-samples", default=1, show_default=True,
              help="GRPO: rollouts per validation task; the task's score is their mean.")
@click.option("--patience", default=4, show_default=True,
              help="GRPO: stop after this many validations without a new best (0: never).")
@click.option("--lr", type=float, default=None,
              help=f"GRPO: learning rate {_per_model('lr', '{:g}')}; above {SMOLLM2.max_lr:g} a pretrained model "
                   "is refused, as it would be wrecked.")
@click.option("--lr-schedule", type=click.Choice(["constant", "cosine", "linear"]), default="constant",
              show_default=True, help="GRPO: decay of the learning rate to a tenth at --max-versions (or the "
                                      "first-run budget's versions; constant when there is no version bound).")
@click.option("--epochs", type=int, default=None, help=f"GRPO: optimizer steps per window {_per_model('epochs')}.")
@click.option("--entropy-coef", type=float, default=None,
              help=f"GRPO: entropy bonus, fading as the reward nears 1 {_per_model('entropy_coef', '{:g}')}.")
@click.option("--train-top-layers", type=click.IntRange(min=0), default=None,
              help="GRPO: train only the top N transformer blocks and the final norm, the rest frozen; 0: every "
                   f"parameter (default per model: smollm2 {SMOLLM2.train_top_layers} of its 30, tiny and other "
                   "Hugging Face models 0).")
@click.option("--lora-rank", type=click.IntRange(min=1), default=None,
              help="GRPO: train LoRA adapters of this rank on every linear layer of the blocks instead of the "
                   "model's weights (--train-top-layers then does not apply); checkpoints hold the merged weights "
                   "(default: off).")
@click.option("--temperature", type=float, default=None,
              help="GRPO: sampling temperature published with each version, for agents that read "
                   f"llm.sampling_parameters {_per_model('temperature', '{:g}')}.")
@click.option("--max-tokens", type=int, default=None,
              help=f"GRPO: response length published with each version {_per_model('max_tokens')}.")
@click.option("--max-staleness", default=2, show_default=True)
@click.option("--trajectories/--per-call", default=True, show_default=True,
              help="GRPO: train a multi-turn attempt as one sequence (only its sampled tokens in the loss), where each "
                   "turn's prompt extends the previous turn's tokens; or each LLM call on its own.")
@click.option("--warm-start", default=None, metavar="RUN|FILE",
              help="GRPO: version 0 is the model fine-tuned first on the best training trajectories of an earlier "
                   "run in this data dir (its id, a unique prefix or its name: `litstream runs`) or of a dataset "
                   "file `litstream export` wrote; rejection-sampling fine-tuning, no new rollouts.")
@click.option("--warm-start-min-reward", type=float, default=RftConfig.min_reward, show_default=True,
              help="GRPO: the reward a trajectory needs to be fine-tuned on by --warm-start.")
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
    the agent), validates on version 0 and every --val-every versions, and prints the reward per version. With
    only --agent and --train (and --val), GRPO trains with the model's defaults until its first-run budget (10
    minutes for tiny, 30 for smollm2; the start line states it) or until validation stops improving, then
    publishes the best validated version (the summary names its resources id and checkpoint). Progress shows,
    per training window, the share of groups whose rewards were all equal and the reward spread; a run without
    learning signal says so and what to try.

    Ctrl-C stops cleanly at any point: every process the run started is stopped, the summary is printed, and
    checkpoints and the event log keep what was done.
    """
    from .fit import Trainer, load_dataset, outcome_lines

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
    extra = summary.extra
    val = extra.get("validation") or {}
    if val:
        last = max(val, key=int)
        e = val[last]
        se = f" ± {e['se']:.3f}" if e.get("se") is not None else ""
        out.print(f"last validation v{last}: {e['mean']:.3f}{se} ({e['tasks']} tasks × {e['samples']})")
    for line in outcome_lines(extra):
        out.print(line)
    for w in extra.get("warnings") or []:
        out.print(f"[yellow]warning:[/] {escape(w)}")
    out.print(f"rollouts {summary.rollouts} {summary.by_status}; took {summary.seconds:.0f}s"
              + ("; interrupted (Ctrl-C or SIGTERM): stopped cleanly" if summary.interrupted else ""))
    if as_json:
        sys.stdout.write(json.dumps(summary.as_dict()) + "\n")
