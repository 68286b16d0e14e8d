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
