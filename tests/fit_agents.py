"""Agents for the Trainer.fit tests: imported by name in runner processes."""

from __future__ import annotations

from typing import Any

from examples.copy_agent import copy_agent, two_turn_agent  # noqa: F401  (re-exported for the runners)


def raising_agent(task: dict[str, Any], llm: Any) -> float:
    if task.get("explode"):
        raise ValueError(f"the agent cannot handle task {task}")
    return 0.5


def slow_agent(task: dict[str, Any]) -> float:
    import time

    time.sleep(float(task.get("seconds", 2.0)))
    return 1.0


def template_agent(task: dict[str, Any], prompt_template: Any) -> float:
    """Scores its prompt template, not a model: 1.0 when the prompt holds the answer (the letter ``count``
    times), 0.5 when it holds the letter, else 0.0. PromptSearch's tests know which template is best."""
    text = prompt_template.format(letter=task["letter"], count=task["count"])
    if str(task["letter"]) * int(task["count"]) in text:
        return 1.0
    return 0.5 if str(task["letter"]) in text else 0.0


def zero_agent(task: dict[str, Any], llm: Any) -> float:
    """Calls the policy (so its rollouts become triplets) and scores every answer 0: no learning signal."""
    copy_agent(task, llm)
    return 0.0


def two_dimension_agent(task: dict[str, Any], llm: Any) -> None:
    """``copy_agent``'s reward as the primary dimension ``copy``, and a second one, ``one``, always 1.0."""
    from litstream.workers.emitters import emit_reward

    emit_reward({"copy": copy_agent(task, llm), "one": 1.0}, primary_key="copy")
