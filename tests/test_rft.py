"""Rejection-sampling fine-tuning's selection (pure): which of a run's exported trajectories train a warm start,
and the rows TRL's SFTTrainer takes (pre-tokenized prompt-completion: ``input_ids`` and ``completion_mask``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litstream.trainer import export
from litstream.trainer.rft import RftConfig, select_best


def record(task: str, reward: float | None, response: list[int], version: int = 1, mode: str = "train",
           mask: list[int] | None = None) -> dict[str, Any]:
    return {"task_id": task, "reward": reward, "mode": mode, "policy_version": version,
            "prompt_token_ids": [1, 2], "response_token_ids": response,
            "response_loss_mask": mask if mask is not None else [1] * len(response)}


def test_the_best_training_trajectories_are_kept_distinct_newest_first_as_masked_rows() -> None:
    records = [
        record("a", 1.0, [5, 6], version=1),
        record("a", 1.0, [5, 6], version=3),  # the same response again: kept once
        record("a", 1.0, [7, 8, 9], version=2, mask=[1, 0, 1]),  # a tool result in between: not in the loss
        record("a", 1.0, [4], version=0),  # a third distinct one: past per_task (2), the oldest is left
        record("b", 0.0, [5]),  # below the reward
        record("b", 1.0, [5], mode="val"),  # validation stays held out
        record("c", None, [5]),  # no reward
        {**record("d", 1.0, [5]), "prompt_token_ids": None, "response_token_ids": None},  # turns that do not join
        record("e", 1.0, list(range(10, 40))),  # too long for max_length
        record("f", 1.0, [5, 6], mask=[0, 0]),  # only a forced call: nothing the model chose
    ]
    chosen = select_best(records, RftConfig(per_task=2, max_length=16))
    assert chosen.rows == [{"input_ids": [1, 2, 5, 6], "completion_mask": [0, 0, 1, 1]},
                           {"input_ids": [1, 2, 7, 8, 9], "completion_mask": [0, 0, 1, 0, 1]}]
    assert (chosen.records, chosen.kept, chosen.tasks) == (10, 2, 1)
    assert chosen.left_out == {"not training rollouts": 1, "below the reward": 2, "turns that do not join": 1,
                               "duplicates or past per_task": 2, "too long": 1, "no token the model chose": 1}
    assert chosen.text().startswith("2 of 10 trajectories over 1 tasks (left out: ")


def test_a_lower_bar_and_an_exported_file_select_the_same_way(tmp_path: Path) -> None:
    records = [record("a", 0.5, [5]), record("b", 0.2, [6])]
    for fmt in export.FORMATS:
        path = tmp_path / f"best.{fmt}"
        export.write([{**r, "messages": [], "run": "r", "rollout_id": "ro", "attempt_id": "at",
                       "policy_versions": [1], "turns": 1} for r in records], path, fmt)
        chosen = select_best(export.read(path), RftConfig(min_reward=0.5))
        assert [row["input_ids"] for row in chosen.rows] == [[1, 2, 5]]
