"""An agent written the usual way, with the ``openai`` client, trained by ``Trainer.fit``.

The task is the toy copy task phrased as a chat message (``"cx2="`` -> ``"cc"``, then stop), which the tiny
byte-level policy can learn. The runner gives the agent an ``llm`` whose endpoint is the policy server's
per-attempt URL, so every call is recorded for this attempt; the agent returns its reward.

    python -m examples.copy_agent --minutes 10        # GRPO on the tiny policy, with validation
    litstream train --agent examples.copy_agent:copy_agent --train examples/data/copy_train.jsonl \\
                    --val examples/data/copy_val.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

import openai

from litstream.trainer import toy_task


def _client(llm: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=2)


def copy_agent(task: dict[str, Any], llm: Any) -> float:
    """One chat call; the reward is the toy task's (1.0 for exactly the letter ``count`` times)."""
    answer = _client(llm).chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": toy_task.render_prompt(task)}],
        max_tokens=toy_task.MAX_NEW_TOKENS, temperature=1.0)
    return toy_task.reward(task, answer.choices[0].message.content or "")


def two_turn_agent(task: dict[str, Any], llm: Any) -> float:
    """Two calls per rollout: an answer, then the same question again with the first exchange in the history;
    the reward scores the second. Its two triplets come out in call order."""
    client = _client(llm)
    messages: list[Any] = [{"role": "user", "content": toy_task.render_prompt(task)}]
    first = client.chat.completions.create(model=llm.model, messages=messages, max_tokens=toy_task.MAX_NEW_TOKENS)
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": toy_task.render_prompt(task)}]
    second = client.chat.completions.create(model=llm.model, messages=messages, max_tokens=toy_task.MAX_NEW_TOKENS)
    return toy_task.reward(task, second.choices[0].message.content or "")


def make_dataset(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [toy_task.make_task(rng) for _ in range(n)]


def main() -> None:
    from litstream.app.fit import Trainer
    from litstream.trainer.algorithm import GRPO

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--passes", type=int, default=40)
    parser.add_argument("--minutes", type=float, default=10.0, help="training time budget")
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    args = parser.parse_args()
    # The demo's measured settings (docs/training.md): 16 groups of 8 per step, 4 epochs, an entropy bonus, one
    # runner whose many slots share the policy endpoint's batches.
    algorithm = GRPO(model=args.model, group_size=8, groups_per_step=16, passes=args.passes, val_every=10,
                     lr=1e-3, ppo_epochs=4, entropy_coef=0.03, max_staleness=2, minutes=args.minutes)
    summary = Trainer(algorithm=algorithm, n_runners=1, concurrency=64).fit(
        copy_agent, make_dataset(args.tasks, 0), make_dataset(16, 1))
    print(json.dumps(summary.as_dict()))


if __name__ == "__main__":
    main()
