"""The GPU path's prepared check (bench/trainer_device.py), run on the CPU: both ways of training step, and the
learner on the checked device scores as the CPU path does (here the same device, so to float32 rounding)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from bench import trainer_device

torch.set_num_threads(1)


def test_the_device_check_runs_both_ways_of_training_and_compares_log_probs(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    rows = trainer_device.main(["--device", "cpu", "--precision", "fp32", "--model", "tiny", "--steps", "1",
                                "--groups", "2", "--group-size", "4", "--max-tokens", "8", "--lora-rank", "4",
                                "--out", str(out)])
    assert [r["mode"] for r in rows] == ["top-blocks", "lora"] and json.loads(out.read_text()) == rows
    for r in rows:
        assert r["logprob_max_abs_diff"] < 1e-5 and r["samples"] == 8
        [step] = r["steps"]
        assert math.isfinite(step["loss"]) and step["grad_norm"] > 0 and abs(step["ratio"] - 1.0) < 0.2
    assert rows[1]["trained_parameters"] < rows[0]["trained_parameters"]  # the adapters are the smaller part
