"""The word-problem example's pure parts: the task generator (deterministic, answers right, validation held out)
and the reward (the last number in the answer, exactly)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from examples import arithmetic_agent as ex


def _solve(question: str) -> int:
    """The answer worked out again from the question's wording."""
    nums = [int(n) for n in re.findall(r"\d+", question)]
    if "bags with" in question:
        return nums[0] * nums[1]
    if "then gives away" in question:
        return nums[0] + nums[1] - nums[2]
    if "gets" in question:
        return nums[0] + nums[1]
    assert "gives away" in question
    return nums[0] - nums[1]


@pytest.mark.parametrize("level", ex.LEVELS)
def test_tasks_are_deterministic_and_their_answers_right(level: int) -> None:
    tasks = ex.make_dataset(200, 7, level)
    assert tasks == ex.make_dataset(200, 7, level)
    assert tasks != ex.make_dataset(200, 8, level)
    assert len({t["question"] for t in tasks}) == 200
    for t in tasks:
        assert t["level"] == level
        assert isinstance(t["answer"], int) and t["answer"] >= 0
        assert t["answer"] == _solve(t["question"])
        assert ex.reward(t, f"The answer is {t['answer']}.") == 1.0


def test_levels_differ_in_what_they_ask() -> None:
    rng = random.Random(0)
    one = [ex.make_task(rng, 1) for _ in range(100)]
    assert all(max(int(n) for n in re.findall(r"\d+", t["question"])) <= 10 for t in one)
    three = [ex.make_task(rng, 3) for _ in range(100)]
    assert any("bags with" in t["question"] for t in three)
    four = [ex.make_task(rng, 4) for _ in range(100)]
    assert all("then gives away" in t["question"] for t in four)
    with pytest.raises(ValueError):
        ex.make_task(rng, 5)


def test_validation_set_is_held_out_from_training() -> None:
    train = ex.make_dataset(256, 0, 1)
    val = ex.make_dataset(64, 1, 1, exclude=train)
    assert not {t["question"] for t in train} & {t["question"] for t in val}


def test_the_committed_data_is_the_generators(tmp_path: Path) -> None:
    train = ex.read_jsonl(ex.DATA_DIR / "arithmetic_train.jsonl")
    val = ex.read_jsonl(ex.DATA_DIR / "arithmetic_val.jsonl")
    ex.main(["data", "--level", str(train[0]["level"]), "--train", str(len(train)), "--val", str(len(val)),
             "--out", str(tmp_path)])
    assert ex.read_jsonl(tmp_path / "arithmetic_train.jsonl") == train
    assert ex.read_jsonl(tmp_path / "arithmetic_val.jsonl") == val


@pytest.mark.parametrize(("answer", "expected"), [
    ("42", 1.0),
    ("The answer is 42.", 1.0),
    ("30 + 12 = 42", 1.0),
    ("Tom has 42 apples now", 1.0),
    ("42.0", 1.0),
    ("**42**", 1.0),
    ("42 apples, so 41 are left", 0.0),  # the last number counts
    ("-42", 0.0),
    ("420", 0.0),
    ("4.2", 0.0),
    ("forty-two", 0.0),
    ("", 0.0),
])
def test_reward_checks_the_last_number(answer: str, expected: float) -> None:
    assert ex.reward({"answer": 42}, answer) == expected


def test_last_number_reads_separators_and_signs() -> None:
    assert ex.last_number("1,234 stamps") == 1234.0
    assert ex.last_number("from 5 down to -3") == -3.0
    assert ex.last_number("2.50 each") == 2.5
    assert ex.last_number("no digits") is None


def test_mean_and_stderr() -> None:
    mean, se = ex.mean_and_stderr([0.0, 1.0, 0.5, 0.5])
    assert mean == 0.5
    assert se == pytest.approx((1 / 6) ** 0.5 / 2)


def test_train_runs_with_the_models_measured_defaults() -> None:
    from litstream.trainer.defaults import SMOLLM2

    algorithm = ex.grpo(ex.build_parser().parse_args(["train"]))
    assert (algorithm.temperature, algorithm.lr, algorithm.train_top_layers) == (
        SMOLLM2.temperature, SMOLLM2.lr, SMOLLM2.train_top_layers)
    assert algorithm.max_tokens == ex.MAX_TOKENS and algorithm.window_seconds is None
    args = algorithm.trainer_args()
    assert args[args.index("--train-top-layers") + 1] == str(SMOLLM2.train_top_layers)
    full = ex.grpo(ex.build_parser().parse_args(["train", "--train-top-layers", "0"]))
    assert "--train-top-layers" not in full.trainer_args() and "every parameter trained" in full.settings_text()


def test_plot_draws_a_train_summary(tmp_path: Path) -> None:
    summary = {"train_reward_by_version": {"0": 0.1, "1": 0.2, "2": 0.4},
               "validation": {"0": {"mean": 0.15, "se": 0.03, "tasks": 64, "samples": 4},
                              "2": {"mean": 0.45, "se": None, "tasks": 64, "samples": 4}},
               "best": {"version": 2, "validation": 0.45}}
    out = tmp_path / "curve.png"
    ex.plot(summary, out, "t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow(enabled_by="LITSTREAM_SMOLLM2")
@pytest.mark.timeout(1800)
def test_smollm2_trains_on_word_problems_through_the_policy_endpoint(tmp_path: Path) -> None:
    """A shortened run of the example's `train` (its options, fewer of everything): the openai-client agent
    against SmolLM2 through the policy server, one GRPO version, validated before and after."""
    from litstream.app.fit import Trainer
    from litstream.infra.settings import Settings

    train = ex.read_jsonl(ex.DATA_DIR / "arithmetic_train.jsonl")[:4]
    val = ex.read_jsonl(ex.DATA_DIR / "arithmetic_val.jsonl")[:4]
    algorithm = ex.grpo(ex.build_parser().parse_args(
        ["train", "--group-size", "4", "--groups", "2", "--max-versions", "1", "--val-every", "1"]))
    summary = Trainer(algorithm=algorithm, n_runners=1, concurrency=8,
                      settings=Settings(data_dir=tmp_path / "data", partitions=2), quiet=True).fit(
        "examples.arithmetic_agent:arithmetic_agent", train, val)
    assert summary.failed == 0
    assert {0, 1} <= set(summary.val_reward_by_version)
    assert all(0.0 <= r <= 1.0 for r in summary.val_reward_by_version.values())
