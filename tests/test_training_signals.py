"""The pure parts of a run's judgement: learning signal per window, validation's uncertainty, the best version,
early stop, the learning-rate schedule, each model's defaults and the learning rates refused for it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from litstream.trainer.algorithm import RolloutResult, Validation
from litstream.trainer.defaults import SMOLLM2, TINY, check_lr, defaults_for
from litstream.trainer.signals import (
    ValEstimate,
    best_version,
    lr_factor,
    missing_signal,
    noise_band,
    plateaued,
    val_estimate,
    val_warning,
    window_signal,
)


def test_a_window_counts_its_flat_groups_and_the_spread_within_groups() -> None:
    w = window_signal(3, [[0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1], [0.5]])
    assert (w.version, w.groups, w.flat) == (3, 4, 3)  # a group of one is flat too: it has no advantage
    assert w.flat_share == 0.75
    assert w.spread == pytest.approx(0.5 / 4)  # only [0, 1, 0, 1] spreads, by 0.5
    assert w.reward_mean == pytest.approx(6.5 / 13)
    assert not w.all_zero and not w.all_one
    assert window_signal(0, [[0, 0], [0, 0]]).all_zero
    assert window_signal(0, [[1, 1], [1.0, 1.0]]).all_one


def test_missing_signal_speaks_only_after_enough_windows_without_any() -> None:
    zero = [window_signal(v, [[0, 0, 0], [0, 0, 0]]) for v in range(5)]
    assert missing_signal(zero[:4], over=5) is None  # not long enough yet
    line = missing_signal(zero, over=5, example_rollout="ro-abc")
    assert line is not None and "every reward was 0" in line and "v0-v4" in line
    for hint in ("a model that can reach the task", "reward shaping", "--group-size", "--temperature",
                 "litstream rollout show ro-abc"):
        assert hint in line
    flat = [window_signal(v, [[0.25, 0.25], [0.5, 0.5]]) for v in range(5)]
    line = missing_signal(flat, over=5)
    assert line is not None and "all rewards were equal" in line
    # one group with signal in the last windows: there is something to learn from
    assert missing_signal([*flat[:4], window_signal(4, [[0, 1], [0.5, 0.5]])], over=5) is None
    # every reward 1: solved, nothing is wrong
    assert missing_signal([window_signal(v, [[1, 1], [1, 1]]) for v in range(5)], over=5) is None


def test_validation_error_comes_from_the_spread_of_task_means() -> None:
    est = val_estimate({"a": [1, 1, 1, 1], "b": [0, 0, 0, 0], "c": [1, 0, 1, 0], "d": [1, 1, 0, 0]})
    assert est is not None
    assert (est.tasks, est.samples) == (4, 4)
    assert est.mean == pytest.approx(0.5)
    means = [1.0, 0.0, 0.5, 0.5]
    sd = math.sqrt(sum((m - 0.5) ** 2 for m in means) / 3)
    assert est.se == pytest.approx(sd / 2)
    # tasks weigh the same, however many samples they have
    assert val_estimate({"a": [1], "b": [0, 0, 0]}).mean == pytest.approx(0.5)  # type: ignore[union-attr]
    assert val_estimate({}) is None
    assert math.isinf(val_estimate({"a": [1, 0]}).se)  # type: ignore[union-attr]
    assert "±" in est.text() and "4 tasks × 4" in est.text()


def test_a_small_validation_set_is_flagged_and_a_large_quiet_one_is_not() -> None:
    eight = ValEstimate(mean=0.375, se=0.17, tasks=8, samples=1)  # the 8-task set
    assert noise_band(eight) == pytest.approx(0.17 * 1.96 * math.sqrt(2))
    line = val_warning(eight)
    assert line is not None and "8 task(s) × 1" in line and "cannot be told from noise" in line
    assert "few" in (val_warning(ValEstimate(0.9, 0.01, 8, 8)) or "")  # quiet but few tasks
    assert "no error estimate" in (val_warning(ValEstimate(0.5, math.inf, 1, 4)) or "")
    assert val_warning(ValEstimate(mean=0.5, se=0.02, tasks=200, samples=1)) is None


def test_a_validation_scores_a_failed_rollout_0_and_leaves_out_a_cancelled_one() -> None:
    def result(i: int, status: str, reward: float | None, call: float) -> RolloutResult:
        return RolloutResult(f"ro-{i}", "val", status, reward, 0, None, str(i), {"tool_call": call})

    v = Validation.of([result(0, "succeeded", 1.0, 1.0), result(1, "failed", None, 0.0),
                       result(2, "succeeded", 0.5, 1.0), result(3, "cancelled", None, 0.0)])
    assert v is not None and (v.reward.mean, v.reward.tasks) == (0.5, 3)
    assert v.dimensions["tool_call"].mean == pytest.approx(2 / 3)
    assert v.text().startswith("0.500 ± 0.289 (3 tasks × 1); tool_call 0.667 ± ")
    assert v.as_dict()["dimensions"]["tool_call"]["mean"] == 0.6667
    assert Validation.of([result(0, "cancelled", None, 0.0)]) is None


def test_best_version_and_plateau() -> None:
    vals = {0: 0.0, 5: 0.4, 10: 0.9, 15: 0.85, 20: 0.9, 25: 0.88}
    assert best_version(vals) == 20  # a tie goes to the later version
    assert best_version({}) is None
    assert plateaued(vals, patience=3)  # 15, 20, 25 did not beat 0.9
    assert not plateaued(vals, patience=4)  # 10 beat what came before it
    assert not plateaued({0: 0.1, 5: 0.2}, patience=2)  # not enough validations to tell
    assert not plateaued(vals, patience=0)
    assert not plateaued({0: 0.5, 5: 0.5, 10: 0.56}, patience=2, min_delta=0.05)
    assert plateaued({0: 0.5, 5: 0.5, 10: 0.54}, patience=2, min_delta=0.05)
    assert best_version({0: ValEstimate(0.2, 0.1, 30, 1), 5: ValEstimate(0.3, 0.1, 30, 1)}) == 5


def test_learning_rate_schedules() -> None:
    assert lr_factor(50, "constant", 100) == 1.0
    assert lr_factor(0, "cosine", 100) == pytest.approx(1.0)
    assert lr_factor(50, "cosine", 100) == pytest.approx(0.55)
    assert lr_factor(100, "cosine", 100) == pytest.approx(0.1)
    assert lr_factor(500, "linear", 100) == pytest.approx(0.1)  # held at the floor after the end
    assert lr_factor(50, "linear", 100) == pytest.approx(0.55)
    assert lr_factor(0, "linear", 100, warmup_steps=4) == pytest.approx(0.25)
    assert lr_factor(10, "cosine", None) == 1.0  # no horizon: no decay
    with pytest.raises(ValueError):
        lr_factor(1, "exponential", 10)


def test_each_model_has_its_defaults_and_a_pretrained_one_refuses_a_wrecking_learning_rate() -> None:
    assert defaults_for("tiny") is TINY and defaults_for("smollm2") is SMOLLM2
    other = defaults_for("/models/qwen")
    assert other.pretrained and other.lr == SMOLLM2.lr and other.model == "/models/qwen"
    assert TINY.lr == 1e-3 and SMOLLM2.lr == 1e-5 and SMOLLM2.temperature == 0.5
    assert SMOLLM2.train_top_layers == 15 and TINY.train_top_layers is None
    assert other.train_top_layers is None  # how many blocks to freeze was measured on SmolLM2 only
    refused = check_lr("smollm2", 1e-3)
    assert refused is not None and refused[0] == "refuse" and "random words" in refused[1]
    assert check_lr("/models/qwen", 1e-3)[0] == "refuse"  # type: ignore[index]
    assert check_lr("smollm2", 1e-5) is None and check_lr("smollm2", 3e-5) is None
    warned = check_lr("smollm2", 5e-5)
    assert warned is not None and warned[0] == "warn" and "5x" in warned[1]
    assert check_lr("tiny", 1e-3) is None  # a random init takes large steps
    assert check_lr("tiny", 0.0)[0] == "refuse"  # type: ignore[index]
    assert "minutes" in TINY.budget_text()


def _samples(group: str, rewards: list[float], version: int = 0) -> list[Any]:
    from litstream.trainer.windows import Sample

    return [Sample(f"{group}-r{i}", "a", 0, group, version, (1, 97, 120, 49, 61), (97, 98), (-1.0, -1.0), r)
            for i, r in enumerate(rewards)]


def test_the_learner_applies_its_schedule_the_entropy_fade_and_the_signal_scaled_step() -> None:
    from litstream.trainer.grpo import LossConfig
    from litstream.trainer.learner import GrpoLearner, LearnerConfig
    from litstream.trainer.policy import build_policy

    policy = build_policy("tiny", seed=0)
    cfg = LearnerConfig(lr=1e-3, lr_schedule="linear", total_steps=4, entropy_fade=True, lr_by_signal=True,
                        loss=LossConfig(entropy_coef=0.04))
    learner = GrpoLearner(policy.model, policy.tokenizer, cfg)
    # two groups, one flat: half the step; mean reward 0.375: the bonus keeps 62.5%
    stats = learner.step([_samples("g1", [0.0, 1.0]), _samples("g2", [0.25, 0.25])])
    assert stats.lr == pytest.approx(1e-3 * 0.5)
    assert stats.entropy_coef == pytest.approx(0.04 * (1 - 0.375))
    assert stats.zero_adv_groups == 1
    stats = learner.step([_samples("g3", [0.0, 1.0])])
    assert stats.lr == pytest.approx(1e-3 * (1 - 0.9 * 1 / 4))  # linear decay, second step
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(stats.lr)


def test_pruning_keeps_the_weights_of_every_kth_version(tmp_path: Path) -> None:
    from litstream.trainer.checkpoint import OPTIMIZER, list_checkpoints
    from litstream.trainer.learner import GrpoLearner
    from litstream.trainer.policy import build_policy

    policy = build_policy("tiny", seed=0)
    learner = GrpoLearner(policy.model, policy.tokenizer)
    for v in range(8):
        learner.version = v
        learner.save(tmp_path, keep_last=2, keep_every=5)
    kept = dict(list_checkpoints(tmp_path))
    assert sorted(kept) == [0, 5, 6, 7]
    assert not (kept[0] / OPTIMIZER).exists() and not (kept[5] / OPTIMIZER).exists()  # weights only
    assert (kept[7] / OPTIMIZER).exists()


def test_grpo_fills_what_is_not_given_from_the_model_and_states_its_budget() -> None:
    from litstream.trainer.algorithm import GRPO, _TaskQueue

    tiny = GRPO()
    assert (tiny.lr, tiny.group_size, tiny.groups_per_step, tiny.ppo_epochs) == (1e-3, 8, 16, 4)
    assert tiny.first_run_budget and (tiny.minutes, tiny.max_versions) == (TINY.minutes, TINY.max_versions)
    assert "first-run budget of tiny" in tiny.settings_text() and "validations without a new best" in tiny.budget_text()
    args = tiny.trainer_args()
    assert args[args.index("--keep-every") + 1] == "5" and "--entropy-fade" in args
    assert args[args.index("--max-tokens") + 1] == str(TINY.max_tokens)
    bounded = GRPO(passes=2)
    assert not bounded.first_run_budget and bounded.minutes is None and bounded.max_versions is None
    smollm2 = GRPO(model="smollm2")
    assert smollm2.lr == 1e-5 and smollm2.train_top_layers == 15 and "top 15 transformer blocks" in smollm2.settings_text()
    assert "--train-top-layers" in smollm2.trainer_args() and "--train-top-layers" not in tiny.trainer_args()
    assert "--train-top-layers" not in GRPO(model="smollm2", train_top_layers=0).trainer_args()
    with pytest.raises(ValueError):
        GRPO(model="smollm2", train_top_layers=-1)
    with pytest.raises(ValueError, match="would wreck"):
        GRPO(model="smollm2", lr=1e-3)
    assert GRPO(model="smollm2", lr=5e-5).warnings

    queue = _TaskQueue(["a", "b"], passes=2)
    assert [queue.pop() for _ in range(4)] == [(0, 0, "a"), (0, 1, "b"), (1, 0, "a"), (1, 1, "b")]
    assert not queue
    endless = _TaskQueue(["a"], passes=None)
    for _ in range(1000):
        endless.pop()
    assert endless and endless.remaining_text() == "until the budget:"
    endless.clear()
    assert not endless


def test_the_demo_counts_training_rollouts_only() -> None:
    from litstream.app.closed_loop import train_reward_by_version

    rows = [("r1", "policy-v1", 1.0), ("r2", "policy-v1", 0.0), ("r3", "policy-v1", 1.0), ("r4", "policy-v2", 0.5),
            ("r5", "best-x", 1.0)]
    means, counts = train_reward_by_version(rows, val_ids={"r3"})
    assert means == {1: 0.5, 2: 0.5} and counts == {1: 2, 2: 1}


def test_a_hugging_face_model_directory_is_a_policy_with_the_pretrained_defaults(tmp_path: Path) -> None:
    from litstream.trainer.algorithm import GRPO
    from litstream.trainer.learner import GrpoLearner
    from litstream.trainer.policy import build_policy

    tiny = build_policy("tiny", seed=0)
    saved = GrpoLearner(tiny.model, tiny.tokenizer).save(tmp_path)  # config.json, safetensors, tokenizer
    loaded = build_policy(str(saved))
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert loaded.tokenizer.encode("ax1=") == tiny.tokenizer.encode("ax1=")
    assert GRPO(model=str(saved)).lr == SMOLLM2.lr  # unknown models are treated as pretrained
    with pytest.raises(ValueError, match="Hugging Face causal LM"):
        build_policy(str(tmp_path / "nowhere"))
