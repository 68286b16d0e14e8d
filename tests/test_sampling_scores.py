"""Each sample is scored at the sampling parameters it was drawn with (trainer/sampling.py): the engine's
log-probs and the learner's agree at each sample's own temperature, and what the learner cannot reproduce is left
out of the loss and counted."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from litstream.schemas.events import EventMeta, TripletEmitted
from litstream.trainer.engines import TorchEngine
from litstream.trainer.grpo import pack, response_logprobs
from litstream.trainer.learner import GrpoLearner, LearnerConfig
from litstream.trainer.policy import build_policy
from litstream.trainer.sampling import left_out_text, why_left_out
from litstream.trainer.windows import Sample, to_sample

torch.set_num_threads(1)
TEMPERATURES = [0.3, 0.7, 1.0, 1.5]
# The engine and the learner compute the same float32 forward; measured differences are below 1e-6.
TOLERANCE = 1e-5


def _drawn(temperatures: list[float], **request: Any) -> list[Sample]:
    policy = build_policy("tiny", seed=0)
    tok = policy.tokenizer
    engine = TorchEngine(policy.model, tok)
    out = []
    for k, t in enumerate(temperatures):
        for i, g in enumerate(engine.generate([tok.encode("ax1=")] * 2, 6, temperature=t, seed=k)):
            out.append(Sample(rollout_id=f"ro-{k}-{i}", attempt_id="at-1", index=0, group_id=f"g{k}",
                              policy_version=0, prompt_token_ids=g.prompt_token_ids, response_token_ids=g.token_ids,
                              response_logprobs=g.logprobs, reward=float(i), temperature=t, **request))
    return out


def test_the_engines_logprobs_equal_the_learners_at_each_samples_own_temperature() -> None:
    samples = _drawn(TEMPERATURES)
    policy = build_policy("tiny", seed=0)
    batch = pack([s.prompt_token_ids for s in samples], [s.response_token_ids for s in samples],
                 policy.tokenizer.pad_id)
    with torch.no_grad():
        logp, _ = response_logprobs(policy.model, batch, temperature=[s.temperature or 1.0 for s in samples])
    for b, s in enumerate(samples):
        n = len(s.response_token_ids)
        assert logp[b, :n].tolist() == pytest.approx(list(s.response_logprobs), abs=TOLERANCE)


def test_a_window_of_mixed_temperatures_is_on_policy_whatever_the_run_wide_setting() -> None:
    """A learner that has not moved (lr 0), publishing 0.5: samples drawn at 0.3-1.5 all have ratio 1."""
    policy = build_policy("tiny", seed=0)
    learner = GrpoLearner(policy.model, policy.tokenizer, LearnerConfig(lr=0.0, temperature=0.5))
    stats = learner.step([_drawn(TEMPERATURES)])
    assert stats.ratio_mean == pytest.approx(1.0, abs=TOLERANCE) and stats.clip_frac == 0.0
    assert stats.left_out == {}


def test_what_the_learner_cannot_reproduce_is_left_out_of_the_loss_and_counted() -> None:
    policy = build_policy("tiny", seed=0)
    learner = GrpoLearner(policy.model, policy.tokenizer, LearnerConfig(lr=0.0, temperature=1.0))
    truncated = _drawn([1.0], top_p=0.9)
    greedy = [Sample(**{**s.__dict__, "temperature": 0.0, "rollout_id": s.rollout_id + "g"}) for s in _drawn([1.0])]
    forced = [Sample(**{**s.__dict__, "constrained": True, "rollout_id": s.rollout_id + "c"}) for s in _drawn([1.0])]
    stats = learner.step([truncated + greedy + forced])
    assert stats.left_out == {"top_p": 2, "greedy": 2, "constrained": 2}
    assert stats.tokens == 0 and stats.samples == 6  # no gradient, every reward still counted
    line = left_out_text(stats.left_out, stats.samples)
    assert line is not None and "6 of 6" in line and "top_p" in line


def test_a_sample_without_recorded_parameters_is_scored_at_the_published_temperature() -> None:
    s = _drawn([1.0])[0]
    unknown = Sample(**{**s.__dict__, "temperature": None})
    assert why_left_out(unknown, 0.7) is None and why_left_out(unknown, 0.0) == "greedy"


def test_the_triplet_carries_what_its_span_recorded() -> None:
    meta = EventMeta(event_id="e", rollout_id="ro-1", producer_id="p", producer_seq=1, timestamp_ns=1)
    t = TripletEmitted(meta=meta, attempt_id="at-1", group_id="g", index=0, prompt_token_ids=[1],
                       response_token_ids=[2], response_logprobs=[-0.1], reward=1.0,
                       metadata={"request": {"temperature": 0.7, "top_p": 0.95, "max_tokens": 16},
                                 "constrained": True})
    s = to_sample(t)
    assert (s.temperature, s.top_p, s.top_k, s.constrained) == (0.7, 0.95, None, True)
    bare = to_sample(t.model_copy(update={"metadata": {}}))
    assert (bare.temperature, bare.top_p, bare.constrained) == (None, None, False)
