"""Forced tool calls train: the endpoint records the grammar a call was decoded under, the learner replays its
masks and scores each token under the masked, renormalised distribution it was drawn from, as the engine
reported it (trainer/constrained.py ``replay_allowed``, trainer/grpo.py, trainer/learner.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from litstream.schemas.events import EventMeta, TripletEmitted
from litstream.trainer.constrained import ToolCallGrammar, compile_lark, replay_allowed, tool_call_lark
from litstream.trainer.engines import TorchEngine
from litstream.trainer.grpo import pack, response_logprobs
from litstream.trainer.learner import GrpoLearner, LearnerConfig
from litstream.trainer.policy import build_policy, logits_width
from litstream.trainer.samples import GrammarSpan, Sample
from litstream.trainer.trajectories import join_turns
from litstream.trainer.windows import WindowConfig, Windower, to_sample

torch.set_num_threads(1)
TOLERANCE = 1e-5  # the same float32 forward in the engine and the learner
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"]}
GRAMMAR = ToolCallGrammar(tools=(("get_weather", json.dumps(WEATHER)), ("now", '{"properties": {}}')),
                          begin="<tool_call>\n", end="\n</tool_call>")
LARK = tool_call_lark(GRAMMAR)


def _forced(temperature: float, n: int = 4, seed: int = 0) -> list[Sample]:
    policy = build_policy("tiny", seed=0)
    tok = policy.tokenizer
    engine = TorchEngine(policy.model, tok)
    out = []
    for i, g in enumerate(engine.generate([tok.encode("ax1=")] * n, 80, temperature=temperature, seed=seed,
                                          grammar=GRAMMAR)):
        out.append(Sample(rollout_id=f"ro-{i}", attempt_id="at-1", index=0, group_id="g", policy_version=0,
                          prompt_token_ids=g.prompt_token_ids, response_token_ids=g.token_ids,
                          response_logprobs=g.logprobs, reward=float(i % 2), temperature=temperature,
                          constrained=True, grammars=(GrammarSpan(0, len(g.token_ids), LARK),)))
    return out


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.5])
def test_the_learner_replays_the_grammar_and_scores_a_forced_call_as_the_engine_drew_it(temperature: float) -> None:
    samples = _forced(temperature)
    policy = build_policy("tiny", seed=0)
    compiled = compile_lark(policy.tokenizer, LARK, logits_width(policy.model))
    masks = [[(0, replay_allowed(compiled, s.response_token_ids))] for s in samples]
    batch = pack([s.prompt_token_ids for s in samples], [s.response_token_ids for s in samples],
                 policy.tokenizer.pad_id, grammar_masks=masks)
    with torch.no_grad():
        logp, entropy = response_logprobs(policy.model, batch, with_entropy=True, temperature=temperature)
    assert entropy is not None and torch.isfinite(entropy).all()
    forced_tokens = 0
    for b, s in enumerate(samples):
        n = len(s.response_token_ids)
        assert logp[b, :n].tolist() == pytest.approx(list(s.response_logprobs), abs=TOLERANCE)
        forced_tokens += sum(1 for x in s.response_logprobs if x == 0.0)
        # Where the grammar allowed one token only, the draw had no choice: log-prob 0, entropy 0.
        rows = masks[b][0][1]
        single = rows.sum(axis=1) == 1
        assert np.allclose(logp[b, :n][torch.from_numpy(single)].numpy(), 0.0, atol=1e-6)
        assert np.allclose(entropy[b, :n][torch.from_numpy(single)].numpy(), 0.0, atol=1e-6)
    assert forced_tokens > 10  # the call's frame: "<tool_call>", the name's key, ...


def test_a_forced_call_with_its_grammar_trains_and_one_without_is_left_out() -> None:
    policy = build_policy("tiny", seed=0)
    learner = GrpoLearner(policy.model, policy.tokenizer, LearnerConfig(lr=0.0, temperature=1.0))
    samples = _forced(1.0)
    stats = learner.step([samples])
    assert stats.left_out == {} and stats.ratio_mean == pytest.approx(1.0, abs=TOLERANCE)
    assert stats.tokens == sum(len(s.response_token_ids) for s in samples) and math.isfinite(stats.loss)
    unrecorded = [Sample(**{**s.__dict__, "grammars": ()}) for s in samples]
    assert learner.step([unrecorded]).left_out == {"constrained": 4}


def test_the_gradient_reaches_the_choices_the_grammar_left_open() -> None:
    """A learner with a learning rate moves the forced calls' log-probs; no NaN from the masked-out logits."""
    policy = build_policy("tiny", seed=0)
    learner = GrpoLearner(policy.model, policy.tokenizer, LearnerConfig(lr=1e-2, temperature=1.0))
    samples = _forced(1.0, n=8, seed=3)
    stats = learner.step([samples])
    assert math.isfinite(stats.grad_norm) and stats.grad_norm > 0
    for p in policy.model.parameters():
        assert torch.isfinite(p).all()


def test_a_response_the_grammar_does_not_allow_is_refused_by_the_replay_and_left_out() -> None:
    policy = build_policy("tiny", seed=0)
    tok = policy.tokenizer
    compiled = compile_lark(tok, LARK, logits_width(policy.model))
    with pytest.raises(ValueError, match="not one the grammar allowed"):
        replay_allowed(compiled, tok.encode("hello"))
    s = _forced(1.0, n=2)[0]
    wrong = Sample(**{**s.__dict__, "response_token_ids": tuple(tok.encode("<tool_call>\n{\"nam")),
                      "response_logprobs": (0.0,) * 16, "grammars": (GrammarSpan(0, 16, LARK),)})
    learner = GrpoLearner(policy.model, tok, LearnerConfig(lr=0.0, temperature=1.0))
    assert learner.step([[wrong, s]]).left_out == {"constrained": 1}


def test_the_grammar_travels_from_the_span_to_the_sample() -> None:
    meta = EventMeta(event_id="e", rollout_id="ro-1", producer_id="p", producer_seq=1, timestamp_ns=1)
    t = TripletEmitted(meta=meta, attempt_id="at-1", index=0, group_id="g", prompt_token_ids=[1, 2],
                       response_token_ids=[3, 4, 5], response_logprobs=[-0.1, 0.0, -0.2], reward=1.0,
                       metadata={"constrained": True, "grammar": LARK, "request": {"temperature": 0.7}})
    s = to_sample(t)
    assert s.constrained and s.grammars == (GrammarSpan(0, 3, LARK),) and s.temperature == 0.7
    old = to_sample(TripletEmitted(**{**t.__dict__, "metadata": {"constrained": True}}))
    assert old.constrained and old.grammars == ()
    # A pending turn's grammar survives the windower's checkpoint.
    w = Windower(WindowConfig(group_size=2, trajectories=True))
    w.add(TripletEmitted(**{**t.__dict__, "metadata": {**t.metadata, "calls": 2}}), now=0.0)
    restored = Windower.restore(w.cfg, json.loads(json.dumps(w.snapshot())))
    [turn] = [s for turns in restored._turns.values() for s in turns]
    assert turn.grammars == (GrammarSpan(0, 3, LARK),)


def test_a_joined_trajectory_keeps_its_forced_turn_in_the_loss_under_its_grammar() -> None:
    first = Sample(rollout_id="ro", attempt_id="at", index=0, group_id="g", policy_version=1,
                   prompt_token_ids=(1, 2), response_token_ids=(3, 4), response_logprobs=(0.0, -0.5),
                   reward=math.nan, temperature=0.7, constrained=True, grammars=(GrammarSpan(0, 2, LARK),))
    second = Sample(rollout_id="ro", attempt_id="at", index=1, group_id="g", policy_version=1,
                    prompt_token_ids=(1, 2, 3, 4, 9, 9), response_token_ids=(5, 6), response_logprobs=(-0.1, -0.2),
                    reward=1.0, temperature=0.7)
    joined = join_turns([first, second])
    assert isinstance(joined, Sample)
    assert joined.response_token_ids == (3, 4, 9, 9, 5, 6) and joined.loss_mask == (1, 1, 0, 0, 1, 1)
    assert joined.grammars == (GrammarSpan(0, 2, LARK),) and joined.constrained
    unrecorded = Sample(**{**first.__dict__, "grammars": ()})
    masked = join_turns([unrecorded, second])
    assert isinstance(masked, Sample) and masked.loss_mask == (0, 0, 0, 0, 1, 1) and masked.grammars == ()
