"""Agents written the ways users write them, none tuned for training: the learning matrix
(``python -m examples.matrix_agents``, docs/training-fit.md) trains each with the shipped defaults.

Each takes either task of the shipped examples: the toy copy task of the tiny policy (``{"letter", "count"}``,
``"cx2="`` -> ``"cc"``) and the word problems of SmolLM2 (``{"question", "answer"}``, examples/arithmetic_agent.py).

* ``plain_agent``: one chat call naming no sampling parameter at all (the policy's defaults apply);
* ``hot_agent``: an explicit ``temperature=1.0``;
* ``short_agent``: a short answer budget, ``max_tokens=16``;
* ``sparse_agent``: a 0/1 reward (exactly right or nothing; the toy task's own reward gives partial credit);
* ``LitMatrixAgent``: Agent Lightning's ``LitAgent`` API, its endpoint from the ``main_llm`` resource.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import openai

from examples import arithmetic_agent
from litstream.trainer import toy_task
from litstream.workers.agent import LitAgent

AGENTS = ("plain_agent", "hot_agent", "short_agent", "sparse_agent", "LitMatrixAgent")
# The word problems' reward is already 0/1: there ``sparse_agent`` is ``plain_agent``, trained once, its row shared.
SAME_AS = {"smollm2": {"sparse_agent": "plain_agent"}}


def train_matrix(agents: Sequence[str], model: str, versions: int, data_dir: Path,
                 on_row: Callable[[dict[str, Any]], None] = lambda row: None) -> list[dict[str, Any]]:
    """Each agent trained in its own data directory under ``data_dir``; an agent that is another on this model's
    task gets that one's row."""
    rows: dict[str, dict[str, Any]] = {}
    for agent in agents:
        same = SAME_AS.get(model, {}).get(agent)
        if same is not None and same in rows:
            rows[agent] = {**rows[same], "agent": agent, "same_as": same}
        else:
            rows[agent] = train_one(same or agent, model, versions, data_dir / agent) | {"agent": agent}
        on_row(rows[agent])
    return [rows[a] for a in agents]


def _messages(task: dict[str, Any]) -> list[dict[str, str]]:
    if "question" in task:
        return arithmetic_agent.messages(task)
    return [{"role": "user", "content": toy_task.render_prompt(task)}]


def _reward(task: dict[str, Any], answer: str, sparse: bool = False) -> float:
    if "question" in task:
        return arithmetic_agent.reward(task, answer)  # already 0/1
    if sparse:
        return 1.0 if answer == toy_task.target(task) else 0.0
    return toy_task.reward(task, answer)


def _ask(base_url: str, api_key: str | None, model: str, task: dict[str, Any], **sampling: Any) -> str:
    client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=2)
    answer = client.chat.completions.create(model=model, messages=_messages(task), **sampling)  # type: ignore[arg-type]
    return answer.choices[0].message.content or ""


def plain_agent(task: dict[str, Any], llm: Any) -> float:
    return _reward(task, _ask(llm.endpoint, llm.api_key, llm.model, task))


def hot_agent(task: dict[str, Any], llm: Any) -> float:
    return _reward(task, _ask(llm.endpoint, llm.api_key, llm.model, task, temperature=1.0))


def short_agent(task: dict[str, Any], llm: Any) -> float:
    return _reward(task, _ask(llm.endpoint, llm.api_key, llm.model, task, max_tokens=16))


def sparse_agent(task: dict[str, Any], llm: Any) -> float:
    return _reward(task, _ask(llm.endpoint, llm.api_key, llm.model, task), sparse=True)


class LitMatrixAgent(LitAgent):
    """As Agent Lightning's examples write it: the proxy resource's per-attempt URL, one call, the reward."""

    def rollout(self, task: Any, resources: Any, rollout: Any) -> float:
        llm = resources["main_llm"]
        url = llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)
        return _reward(task, _ask(url, llm.api_key, llm.model, task))


# --- the matrix: each agent trained with the shipped defaults ------------------------------------------------

VERSIONS = {"tiny": 60, "smollm2": 10}  # the budgets the table in docs/training-fit.md was measured with
DATA = {"tiny": ("copy_train.jsonl", "copy_val.jsonl"), "smollm2": ("arithmetic_train.jsonl", "arithmetic_val.jsonl")}


def train_one(agent: str, model: str, versions: int, data_dir: Any, concurrency: int = 32) -> dict[str, Any]:
    """GRPO with the model's defaults and nothing tuned but a budget of ``versions``; v0, the best and the last
    validated version with their standard errors."""
    from litstream.app.fit import Trainer, load_dataset
    from litstream.infra.settings import Settings
    from litstream.trainer.algorithm import GRPO

    train_file, val_file = (arithmetic_agent.DATA_DIR / name for name in DATA[model])
    algorithm = GRPO(model=model, max_versions=versions, patience=None)
    summary = Trainer(algorithm=algorithm, n_runners=1, concurrency=concurrency, settings=Settings(data_dir=data_dir),
                      quiet=True).fit(f"examples.matrix_agents:{agent}", load_dataset(train_file),
                                      load_dataset(val_file))
    val = summary.extra.get("validation", {})
    order = sorted(val, key=int)
    best = max(order, key=lambda v: (val[v]["mean"], int(v))) if order else None
    pick = {"v0": order[0] if order else None, "best": best, "last": order[-1] if order else None}
    if summary.interrupted:
        raise KeyboardInterrupt  # Ctrl-C (or SIGTERM) stops the whole matrix, not just this agent's run
    return {"agent": agent, "model": model, "seconds": round(summary.seconds), "failed": summary.failed,
            "fallbacks": summary.extra.get("fallbacks", []), "left_out": summary.extra.get("left_out", {}),
            **{k: ({"version": int(v), **val[v]} if v is not None else None) for k, v in pick.items()}}


def row_text(r: dict[str, Any]) -> str:
    def cell(x: dict[str, Any] | None) -> str:
        if x is None:
            return "-"
        se = f" ± {x['se']:.3f}" if x.get("se") is not None else ""
        return f"v{x['version']} {x['mean']:.3f}{se}"

    return f"| {r['agent']} | {cell(r['v0'])} | {cell(r['best'])} | {cell(r['last'])} | {r['seconds']} s |"


def main() -> None:
    import argparse
    import json
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(DATA), default="tiny")
    parser.add_argument("--versions", type=int, default=None,
                        help="the training budget of each agent (default: 60 versions for tiny, 10 for smollm2)")
    parser.add_argument("--agents", nargs="*", default=list(AGENTS), choices=AGENTS)
    parser.add_argument("--out", type=Path, default=None, help="append each agent's row as a JSON line here")
    args = parser.parse_args()
    print("| agent | v0 | best | last | time |\n|---|---|---|---|---|", flush=True)

    def report(row: dict[str, Any]) -> None:
        print(row_text(row), flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")

    with tempfile.TemporaryDirectory(prefix="matrix-") as tmp:
        train_matrix(args.agents, args.model, args.versions or VERSIONS[args.model], Path(tmp), report)

if __name__ == "__main__":
    main()
