"""A toy agent with a verifiable reward: answer ``a op b``. Used by ``litstream demo`` and the tests.

The policy here is a fixed rule that is right about half the time, standing in for an LLM call; the spans it
emits follow the OpenTelemetry GenAI conventions the way a real LLM call's would.
"""

from __future__ import annotations

import random
from typing import Any

from .sdk import AttemptContext

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def make_task(rng: random.Random) -> dict[str, Any]:
    return {"a": rng.randint(0, 20), "b": rng.randint(0, 20), "op": rng.choice(sorted(OPS))}


def toy_policy(prompt: str, task: dict[str, Any]) -> str:
    """Stands in for the model: exact for '+', off by one otherwise."""
    value = OPS[task["op"]](task["a"], task["b"])
    return str(value if task["op"] == "+" else value + 1)


def arithmetic_agent(task: dict[str, Any], ctx: AttemptContext) -> None:
    t = task
    with ctx.span("agent.rollout", {"task.op": t["op"]}):
        prompt = f"What is {t['a']} {t['op']} {t['b']}? Answer with a number."
        with ctx.span("chat toy-policy", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "toy-policy",
                                          "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": prompt}) as llm:
            answer = toy_policy(prompt, t)
            llm.set_attributes({"gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": answer,
                                "gen_ai.usage.input_tokens": len(prompt.split()),
                                "gen_ai.usage.output_tokens": 1})
        with ctx.span("verify", {"expected": OPS[t["op"]](t["a"], t["b"])}):
            correct = answer.strip() == str(OPS[t["op"]](t["a"], t["b"]))
        ctx.emit_reward(1.0 if correct else 0.0)
