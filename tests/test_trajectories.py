"""Trajectory mode: a multi-turn attempt's turns joined into one sample, only the sampled tokens in the loss."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from litstream.schemas.events import EventMeta, TripletEmitted
from litstream.trainer.grpo import pack
from litstream.trainer.learner import GrpoLearner, LearnerConfig, trained_tokens
from litstream.trainer.policy import build_policy
from litstream.trainer.trajectories import JoinStats, join_attempt, join_turns
from litstream.trainer.windows import Sample, WindowConfig, Windower

# A two-turn conversation: the call, a tool result, the answer. Each prompt is the previous prompt and response
# and then what came between them (the tool's result and the template's glue).
P0, R0 = (1, 10, 11), (20, 21, 2)
GLUE1, R1 = (30, 31, 32), (40, 2)
GLUE2, R2 = (50,), (60, 61, 2)


def turn(index: int, prompt: tuple[int, ...], response: tuple[int, ...], reward: float = math.nan,
         **kw: Any) -> Sample:
    fields: dict[str, Any] = {"rollout_id": "ro-1", "attempt_id": "at-1", "index": index, "group_id": "g",
                              "policy_version": 3, "prompt_token_ids": prompt, "response_token_ids": response,
                              "response_logprobs": tuple(-0.1 * (k + 1) for k in range(len(response))),
                              "reward": reward, "temperature": 0.7}
    fields.update(kw)
    return Sample(**fields)


def three_turns() -> list[Sample]:
    p1 = P0 + R0 + GLUE1
    p2 = p1 + R1 + GLUE2
    return [turn(0, P0, R0), turn(1, p1, R1, policy_version=2), turn(2, p2, R2, reward=1.0, policy_version=4)]


def test_turns_that_extend_each_other_join_into_one_sample_with_only_sampled_tokens_trained() -> None:
    turns = three_turns()
    joined = join_turns(list(reversed(turns)))  # any arrival order
    assert isinstance(joined, Sample)
    assert joined.prompt_token_ids == P0
    assert joined.response_token_ids == R0 + GLUE1 + R1 + GLUE2 + R2
    assert joined.loss_mask == (1,) * 3 + (0,) * 3 + (1,) * 2 + (0,) + (1,) * 3
    assert joined.response_logprobs == (turns[0].response_logprobs + (0.0,) * 3 + turns[1].response_logprobs
                                        + (0.0,) + turns[2].response_logprobs)
    # the attempt's final reward; the oldest version for staleness; the turns' own sampling
    assert (joined.reward, joined.policy_version, joined.temperature, joined.turns) == (1.0, 2, 0.7, 3)
    assert trained_tokens(joined) == 8
    # the whole sequence is exactly the last turn's prompt and response
    assert tuple(joined.prompt_token_ids) + tuple(joined.response_token_ids) == turns[2].prompt_token_ids + R2


def test_a_forced_call_is_masked_out_of_the_loss_and_the_rest_still_trains() -> None:
    turns = three_turns()
    turns[0] = replace(turns[0], constrained=True, temperature=1.0)  # a forced call: the grammar's own sampling
    joined = join_turns(turns)
    assert isinstance(joined, Sample) and not joined.constrained and joined.temperature == 0.7
    assert joined.loss_mask is not None and joined.loss_mask[:3] == (0, 0, 0) and trained_tokens(joined) == 5


@pytest.mark.parametrize(("change", "reason"), [
    (lambda ts: [ts[0], replace(ts[1], prompt_token_ids=(1, 10, 11, 20, 99, 2, 30)), ts[2]],
     "prompt does not extend the previous turn"),  # the template re-rendered the history as other tokens
    (lambda ts: [ts[0], replace(ts[1], temperature=1.0), ts[2]], "turns drawn differently"),
    (lambda ts: [ts[0], ts[2]], "missing turn"),
    (lambda ts: [replace(t, reward=math.nan) for t in ts], "no reward"),
])
def test_turns_that_cannot_be_joined_stay_per_call_and_say_why(change: Any, reason: str) -> None:
    turns = change(three_turns())
    assert join_turns(turns) == reason
    stats = JoinStats()
    assert join_attempt(turns, stats) == sorted(turns, key=lambda s: s.index)
    assert stats.fallbacks == {reason: 1} and stats.joined == 0


def triplet(attempt: str, index: int, prompt: tuple[int, ...], response: tuple[int, ...], reward: float | None,
            calls: int, group: str = "g") -> TripletEmitted:
    meta = EventMeta(event_id=f"e-{attempt}-{index}", rollout_id=f"ro-{attempt}", producer_id="p",
                     producer_seq=index + 1, timestamp_ns=1)
    return TripletEmitted(meta=meta, attempt_id=attempt, group_id=group, index=index, resources_id="policy-v0",
                          prompt_token_ids=list(prompt), response_token_ids=list(response),
                          response_logprobs=[-0.5] * len(response), reward=reward,
                          metadata={"calls": calls, "request": {"temperature": 0.7}})


def two_turn_attempt(attempt: str, reward: float, group: str = "g") -> list[TripletEmitted]:
    p1 = P0 + R0 + GLUE1
    return [triplet(attempt, 0, P0, R0, None, 2, group), triplet(attempt, 1, p1, R1, reward, 2, group)]


def test_the_windower_joins_each_attempt_once_all_its_turns_arrived_and_groups_count_attempts() -> None:
    w = Windower(WindowConfig(group_size=2, max_samples=2, trajectories=True))
    first, second = two_turn_attempt("a1", 1.0), two_turn_attempt("a2", 0.0)
    assert w.add(first[0], 0) is None and w.add(second[0], 0) is None
    snap = json.loads(json.dumps(w.snapshot()))  # a checkpoint taken while turns wait for the rest
    w = Windower.restore(WindowConfig(group_size=2, max_samples=2, trajectories=True), snap)
    assert w.add(first[1], 0) is None
    window = w.add(second[1], 0)
    assert window is not None and len(window.samples) == 2  # two attempts: one group of two
    assert {s.reward for s in window.samples} == {1.0, 0.0} and all(s.turns == 2 for s in window.samples)
    assert w.joins.joined == 2 and w.stats.no_reward == 0
    # per-call mode keeps Agent Lightning's semantics: the first call has no reward and is dropped
    per_call = Windower(WindowConfig(group_size=2, max_samples=2, trajectories=False))
    per_call.add_many([*two_turn_attempt("a1", 1.0), *two_turn_attempt("a2", 0.0)], 0)
    assert per_call.stats.no_reward == 2 and per_call.stats.trained_samples == 2


def test_a_joined_sample_trains_only_its_sampled_tokens() -> None:
    joined = join_turns(three_turns())
    assert isinstance(joined, Sample)
    batch = pack([joined.prompt_token_ids], [joined.response_token_ids], 0, [joined.loss_mask])
    assert batch.response_mask[0].tolist() == [float(m) for m in joined.loss_mask or ()]
    policy = build_policy("tiny")
    learner = GrpoLearner(policy.model, policy.tokenizer, LearnerConfig(lr=1e-3, temperature=0.7))
    other = replace(joined, attempt_id="at-2", reward=0.0)
    stats = learner.step([[joined, other]])
    assert stats.tokens == 2 * trained_tokens(joined) and stats.left_out == {}
    assert math.isfinite(stats.loss) and torch.isfinite(torch.tensor(stats.grad_norm))


def test_an_attempt_with_a_malformed_turn_is_not_held_forever() -> None:
    """A turn the windower refuses (no response tokens) still counts as arrived: the attempt's other turns train
    per call ("missing turn") instead of waiting for a turn that will never come."""
    w = Windower(WindowConfig(group_size=1, max_samples=1, min_group_size=1, trajectories=True))
    first, second = two_turn_attempt("a1", 1.0)
    broken = first.model_copy(update={"response_token_ids": [], "response_logprobs": []})
    assert w.add(broken, 0) is None
    window = w.add(second, 0)
    assert window is not None and [s.index for s in window.samples] == [1]
    assert w.stats.malformed == 1 and w.joins.fallbacks == {"missing turn": 1} and not w._turns
