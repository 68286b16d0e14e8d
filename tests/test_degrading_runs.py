"""A degrading run says so and falls back: the drift bands and the validation-falling rule (pure), the learner's
KL to the starting policy, and the trainer restarting from the best validated version's weights (real broker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from litstream.infra.settings import Settings
from litstream.trainer.algorithm import GRPO, _DriftWatch
from litstream.trainer.checkpoint import load_checkpoint
from litstream.trainer.learner import GrpoLearner, LearnerConfig
from litstream.trainer.policy import build_policy
from litstream.trainer.process import TrainerConfig, TrainerProcess
from litstream.trainer.signals import DriftBands, ValEstimate, drift_problem, validation_falling
from litstream.trainer.windows import Sample

torch.set_num_threads(1)
TASKS = [{"letter": "a", "count": 1}, {"letter": "b", "count": 2}, {"letter": "c", "count": 1}]


def test_a_step_out_of_band_is_named_and_one_within_it_is_not() -> None:
    bands = DriftBands()
    assert drift_problem({"entropy": 0.5, "kl_start": 0.1, "clip_frac": 0.02}, 0.4, bands) is None
    salad = drift_problem({"entropy": 2.0, "kl_start": 1.5, "clip_frac": 0.6}, 0.4, bands)
    assert salad is not None and "entropy 2.000 is 5.00x" in salad and "KL" in salad and "60% of tokens" in salad
    assert "collapsed" not in (drift_problem({"entropy": 0.01}, 0.4, bands) or "") and \
        drift_problem({"entropy": 0.01}, 0.4, bands) is not None


def _vals(means: dict[int, float]) -> dict[int, ValEstimate]:
    return {v: ValEstimate(mean=m, se=0.02, tasks=64, samples=1) for v, m in means.items()}


def test_validation_falling_twice_in_a_row_below_the_best_is_a_degrading_run() -> None:
    assert validation_falling(_vals({0: 0.1, 5: 0.3, 10: 0.2, 15: 0.15})) is not None
    assert validation_falling(_vals({0: 0.1, 5: 0.3, 10: 0.2, 15: 0.25})) is None  # a wobble
    assert validation_falling(_vals({0: 0.3, 5: 0.5, 10: 0.4})) is None  # 0.5 -> 0.4 is not twice
    assert validation_falling(_vals({0: 0.1, 5: 0.3, 10: 0.2, 15: 0.15}), since=10) is None  # after a fallback


def test_the_watch_falls_back_after_two_steps_out_of_band_and_judges_only_what_comes_after() -> None:
    watch = _DriftWatch(DriftBands())
    assert watch.drifting({"version": 1, "entropy": 0.4, "clip_frac": 0.0}) is None
    assert watch.drifting({"version": 2, "entropy": 2.0, "clip_frac": 0.0}) is None  # once is not yet a trend
    assert watch.drifting({"version": 2, "entropy": 2.0, "clip_frac": 0.0}) is None  # the same step again
    assert watch.drifting({"version": 3, "entropy": 2.5, "clip_frac": 0.0}) is not None
    watch.restart(4)
    assert watch.drifting({"version": 4, "entropy": 2.5, "clip_frac": 0.0}) is None
    assert _DriftWatch(None).drifting({"version": 9, "entropy": 99.0}) is None  # not watched (tiny)


def test_samples_left_out_are_warned_once_per_new_reason() -> None:
    watch = _DriftWatch(None)
    assert watch.left_out_news({"left_out": {}, "samples_total": 8}) == []
    first = watch.left_out_news({"left_out": {"top_p": 3}, "samples_total": 8})
    assert len(first) == 1 and "3 of 8 samples" in first[0] and "top_p" in first[0]
    assert watch.left_out_news({"left_out": {"top_p": 9}, "samples_total": 16}) == []
    assert len(watch.left_out_news({"left_out": {"top_p": 9, "greedy": 1}, "samples_total": 24})) == 1


def test_pretrained_models_are_watched_and_measure_their_kl_to_the_start() -> None:
    assert GRPO(model="smollm2").watch_drift and "--watch-kl" in GRPO(model="smollm2").trainer_args()
    assert not GRPO(model="tiny").watch_drift and "--watch-kl" not in GRPO(model="tiny").trainer_args()
    policy = build_policy("tiny", seed=0)
    tok = policy.tokenizer
    learner = GrpoLearner(policy.model, tok, LearnerConfig(lr=1e-2, watch_kl=True))
    window = [Sample(rollout_id=f"ro-{i}", attempt_id="at-1", index=0, group_id="g", policy_version=0,
                     prompt_token_ids=tok.encode("ax1="), response_token_ids=[97 + i, tok.eos_id],
                     response_logprobs=[], reward=float(i)) for i in range(4)]
    assert learner.step([window]).kl == 0.0  # the first step starts where the reference is
    learner.step([window])
    assert learner.step([window]).kl > 0.0  # it has moved


def test_a_trainer_restored_from_a_checkpoint_serves_its_weights_as_the_next_version(
        settings: Settings, tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    policy = build_policy("tiny", seed=0)
    learner = GrpoLearner(policy.model, policy.tokenizer, LearnerConfig(lr=1e-3))
    best = learner.save(root)  # v0
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(0.05)
    learner.version = 3
    learner.save(root)  # v3: the damaged one
    trainer = TrainerProcess(settings, TrainerConfig(checkpoint_dir=root, restore=best))
    try:
        assert trainer.learner.version == 4 and trainer.report()["restored_from"] == str(best)
        restored = load_checkpoint(trainer.path)
        for a, b in zip(restored.model.state_dict().values(), load_checkpoint(best).model.state_dict().values()):
            assert torch.equal(a, b)
    finally:
        trainer.loop.consumer.close()
        trainer.events.close()


@pytest.mark.slow(enabled_by="LITSTREAM_LONG_RUNS")  # a minute or more; CI runs it (.ci/run)
@pytest.mark.timeout(900)
def test_a_run_out_of_band_falls_back_to_its_best_version_and_then_stops(tmp_path: Path) -> None:
    """Bands no step can meet (entropy above half the first step's): after two steps the run falls back to v0,
    its best validated version, through a trainer restarted with v0's weights; after two more it stops."""
    from litstream.app.fit import Trainer

    algorithm = GRPO(group_size=2, groups_per_step=1, passes=40, val_every=5, window_seconds=5.0,
                     watch_drift=True, drift_bands=DriftBands(entropy_high=0.5), max_fallbacks=1, max_versions=30)
    summary = Trainer(algorithm=algorithm, n_runners=1, concurrency=4, quiet=True,
                      settings=Settings(data_dir=tmp_path / "data", partitions=2)).fit(
        "tests.fit_agents:copy_agent", TASKS, TASKS[:2])
    fallbacks = summary.extra["fallbacks"]
    assert len(fallbacks) == 1 and fallbacks[0]["to_version"] == 0 and "entropy" in fallbacks[0]["reason"]
    assert summary.extra["stopped"].startswith("the policy is degrading")
    restored = [json.loads(line) for line in (tmp_path / "data" / "train" / "trainer-metrics.jsonl").read_text()
                .splitlines()]
    assert restored  # the restarted trainer went on training from the restored weights
    assert summary.failed == 0
