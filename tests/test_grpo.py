"""GRPO maths against values computed by hand."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from litstream.trainer.grpo import LossConfig, group_advantages, grpo_loss, pack, response_logprobs
from litstream.trainer.policy import build_policy

torch.set_num_threads(1)


def test_advantages_sample_std_partial_and_single_groups() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 5.0, 2.0, 4.0]
    groups = ["a", "a", "a", "a", "b", "c", "c"]
    adv = group_advantages(rewards, groups, eps=0.0)
    # group a: mean 0.5, sample std sqrt(4 * 0.25 / 3) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    assert adv[:4] == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s])
    assert adv[4] == 0.0  # a group of one has no advantage
    # group c (partial, 2 members): mean 3, sample std sqrt(2)
    assert adv[5:] == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)])


def test_advantages_population_std_and_uniform_group() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], ["a"] * 4, eps=0.0, unbiased=False)
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0])  # population std 0.5
    assert group_advantages([0.3, 0.3, 0.3], ["g"] * 3) == [0.0, 0.0, 0.0]  # no spread, no signal


def test_clipped_loss_by_hand() -> None:
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.5], [-0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, st = grpo_loss(logp, old, adv, mask, LossConfig(clip_eps=0.2))
    # token (0,0): ratio e^0.2 = 1.2214 > 1.2 and A > 0 -> clipped: -1.2
    # token (0,1): ratio e^-0.5 = 0.6065, A > 0 -> min(ratio, clip) = ratio: -0.6065
    # token (1,0): ratio 1, A = -2 -> 2
    expected = (-1.2 - math.exp(-0.5) + 2.0) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert st.tokens == 3 and st.clipped == 1
    assert st.ratio / st.tokens == pytest.approx((math.exp(0.2) + math.exp(-0.5) + 1) / 3, abs=1e-6)
    loss.backward()
    assert logp.grad is not None
    g = logp.grad
    assert g[0, 0].item() == 0.0  # clipped: no gradient
    assert g[0, 1].item() == pytest.approx(-math.exp(-0.5) / 3, abs=1e-6)  # d(-A * ratio)/dlogp / N
    assert g[1, 0].item() == pytest.approx(2.0 / 3, abs=1e-6)
    assert g[1, 1].item() == 0.0  # padding


def test_dual_clip_bounds_negative_advantage_loss() -> None:
    logp, old = torch.tensor([[0.0]]), torch.tensor([[-2.0]])  # ratio e^2 = 7.389
    mask, adv = torch.ones(1, 1), torch.tensor([-1.0])
    plain, _ = grpo_loss(logp, old, adv, mask, LossConfig())
    assert plain.item() == pytest.approx(math.exp(2.0), abs=1e-5)  # max(7.389, 1.2)
    dual, _ = grpo_loss(logp, old, adv, mask, LossConfig(dual_clip=3.0))
    assert dual.item() == pytest.approx(3.0)


def test_k3_kl_value_and_weight() -> None:
    logp, old = torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-0.5, -1.0]])  # ref - logp = 0.5, 0
    mask, adv = torch.ones(1, 2), torch.tensor([0.0])
    k3 = math.exp(0.5) - 0.5 - 1  # 0.14872
    loss, st = grpo_loss(logp, old, adv, mask, LossConfig(kl_beta=0.1), ref_logp=ref)
    assert st.kl / st.tokens == pytest.approx(k3 / 2, abs=1e-6)
    assert loss.item() == pytest.approx(0.1 * k3 / 2, abs=1e-6)
    off, _ = grpo_loss(logp, old, adv, mask, LossConfig(kl_beta=0.0), ref_logp=ref)
    assert off.item() == pytest.approx(0.0, abs=1e-7)


def test_normalizer_makes_micro_batches_add_up() -> None:
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    old = logp - 0.05
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([0.7, -0.3])
    whole, _ = grpo_loss(logp, old, adv, mask)
    a, _ = grpo_loss(logp[:1], old[:1], adv[:1], mask[:1], normalizer=3.0)
    b, _ = grpo_loss(logp[1:], old[1:], adv[1:], mask[1:], normalizer=3.0)
    assert (a + b).item() == pytest.approx(whole.item(), abs=1e-7)


def test_response_logprobs_match_unpadded_forward() -> None:
    p = build_policy("tiny", seed=3)
    prompts = [[257, 97, 120, 50, 61], [257, 98, 61]]
    responses = [[97, 97, 258], [99]]
    batch = pack(prompts, responses, p.tokenizer.pad_id)
    logp, ent = response_logprobs(p.model, batch, with_entropy=True)
    assert logp.shape == (2, 3) and ent is not None
    for b, (pr, rs) in enumerate(zip(prompts, responses)):
        with torch.no_grad():
            logits = p.model(torch.tensor([pr + rs])).logits[0]
        ref = torch.log_softmax(logits, -1)
        for j, tok in enumerate(rs):
            assert logp[b, j].item() == pytest.approx(ref[len(pr) - 1 + j, tok].item(), abs=1e-5)
    assert logp[1, 1:].abs().sum().item() == 0.0  # masked
    assert 0 < ent[0, 0].item() <= math.log(259) + 1e-4


def test_entropy_bonus_lowers_the_loss_by_coef_times_token_mean_entropy() -> None:
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0]])
    entropy = torch.tensor([[0.5, 1.5]], requires_grad=True)
    adv = torch.tensor([1.0])
    plain, _ = grpo_loss(logp, logp.detach(), adv, mask, LossConfig())
    bonus, st = grpo_loss(logp, logp.detach(), adv, mask, LossConfig(entropy_coef=0.1), entropy=entropy)
    assert bonus.item() == pytest.approx(plain.item() - 0.1 * 1.0)  # token mean of the entropy is 1.0
    bonus.backward()
    assert entropy.grad is not None and entropy.grad[0].tolist() == pytest.approx([-0.05, -0.05])
    assert st.entropy == pytest.approx(2.0)  # the stats keep the summed entropy


def test_epochs_take_that_many_optimizer_steps_on_one_window() -> None:
    from litstream.trainer.learner import GrpoLearner, LearnerConfig
    from litstream.trainer.windows import Sample

    policy = build_policy("tiny", seed=0)
    tok = policy.tokenizer
    samples = [Sample(rollout_id=f"ro-{i}", attempt_id="at-1", index=0, group_id="g", policy_version=0,
                      prompt_token_ids=tok.encode("ax1="), response_token_ids=[97 + i, tok.eos_id],
                      response_logprobs=[], reward=float(i)) for i in range(4)]
    learner = GrpoLearner(policy.model, tok, LearnerConfig(lr=1e-3, epochs=3))
    learner.step([samples])
    state = learner.optimizer.state[next(iter(policy.model.parameters()))]
    assert int(state["step"]) == 3  # three AdamW steps on one window, one policy version
    assert learner.version == 1


def test_decoupled_loss_equals_plain_ppo_on_fresh_samples_and_weights_stale_ones() -> None:
    torch.manual_seed(0)
    logp = torch.randn(3, 4, requires_grad=True)
    old = logp.detach() + 0.1 * torch.randn(3, 4)
    adv, mask = torch.tensor([1.0, -0.5, 0.2]), torch.ones(3, 4)
    cfg = LossConfig(decoupled=True, max_behavior_weight=2.0)
    plain, _ = grpo_loss(logp, old, adv, mask, cfg)
    same, _ = grpo_loss(logp, old, adv, mask, cfg, prox_logp=old)  # the engine's policy is the proximal one
    assert torch.allclose(plain, same)
    # A stale sample: the proximal policy likes its tokens far more than the engine did; the weight is capped.
    prox = old + 3.0
    stale, _ = grpo_loss(logp, old, adv, mask, cfg, prox_logp=prox)
    anchored, _ = grpo_loss(logp, prox, adv, mask, LossConfig())
    assert torch.allclose(stale, 2.0 * anchored)


def test_response_logprobs_at_a_temperature_are_those_of_the_scaled_logits() -> None:
    p = build_policy("tiny", seed=3)
    prompts, responses = [[257, 97, 61]], [[97, 98, 258]]
    batch = pack(prompts, responses, p.tokenizer.pad_id)
    with torch.no_grad():
        logp, ent = response_logprobs(p.model, batch, with_entropy=True, temperature=0.5)
        logits = p.model(torch.tensor([prompts[0] + responses[0]])).logits[0, 2:5] / 0.5
    ref = torch.log_softmax(logits, -1)
    assert logp[0].tolist() == pytest.approx([ref[j, t].item() for j, t in enumerate(responses[0])], abs=1e-5)
    assert ent is not None and ent[0].tolist() == pytest.approx((-(ref.exp() * ref).sum(-1)).tolist(), abs=1e-5)
    with torch.no_grad():
        greedy, _ = response_logprobs(p.model, batch, temperature=0.0)  # greedy: untempered
        plain, _ = response_logprobs(p.model, batch)
    assert torch.equal(greedy, plain)


@pytest.mark.parametrize(("learner_temperature", "on_policy"), [(0.5, True), (1.0, False)])
def test_sampling_at_a_temperature_is_on_policy_when_the_learner_scores_at_it(
        learner_temperature: float, on_policy: bool) -> None:
    """Samples from the engine at temperature 0.5, stepped by a learner that has not moved (lr 0): scored at 0.5
    every ratio is 1 and none is clipped; scored untempered the ratio compares another policy."""
    from litstream.trainer.engines import TorchEngine
    from litstream.trainer.learner import GrpoLearner, LearnerConfig
    from litstream.trainer.windows import Sample

    policy = build_policy("tiny", seed=0)
    tok = policy.tokenizer
    gens = TorchEngine(policy.model, tok).generate([tok.encode("ax1=")] * 8, 6, temperature=0.5, seed=1)
    samples = [Sample(rollout_id=f"ro-{i}", attempt_id="at-1", index=0, group_id="g", policy_version=0,
                      prompt_token_ids=g.prompt_token_ids, response_token_ids=g.token_ids,
                      response_logprobs=g.logprobs, reward=float(i % 2)) for i, g in enumerate(gens)]
    learner = GrpoLearner(policy.model, tok, LearnerConfig(lr=0.0, temperature=learner_temperature))
    stats = learner.step([samples])
    if on_policy:
        assert stats.ratio_mean == pytest.approx(1.0, abs=1e-5) and stats.clip_frac == 0.0
    else:
        assert abs(stats.ratio_mean - 1.0) > 0.05


def test_the_trainer_scores_at_the_temperature_it_publishes() -> None:
    from litstream.trainer.learner import LearnerConfig
    from litstream.trainer.process import TrainerConfig

    cfg = TrainerConfig(sampling={"temperature": 0.5, "max_tokens": 16}, learner=LearnerConfig(lr=1e-5))
    assert cfg.learner_config().temperature == 0.5 and cfg.learner_config().lr == 1e-5
    assert TrainerConfig(sampling={"temperature": 0.0}).learner_config().temperature == 1.0  # greedy: untempered


def _window(tok: Any) -> list[Any]:
    from litstream.trainer.windows import Sample

    return [Sample(rollout_id=f"ro-{i}", attempt_id="at-1", index=0, group_id="g", policy_version=0,
                   prompt_token_ids=tok.encode("ax1="), response_token_ids=[97 + i, tok.eos_id],
                   response_logprobs=[], reward=float(i)) for i in range(4)]


def test_training_the_top_layers_changes_them_and_leaves_the_rest_as_it_was() -> None:
    """train_top_layers=2 of the tiny model's 4 blocks: after a step the top 2 blocks and the final norm moved;
    the embeddings, the output layer and the lower blocks did not, got no gradient, and the optimizer never held
    them."""
    from litstream.trainer.learner import GrpoLearner, LearnerConfig

    policy = build_policy("tiny", seed=0)
    model = policy.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    learner = GrpoLearner(model, policy.tokenizer, LearnerConfig(lr=1e-2, train_top_layers=2))
    held = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    learner.step([_window(policy.tokenizer)])
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {n for n in before if n.startswith(("model.layers.2.", "model.layers.3.", "model.norm."))}
    for name, p in model.named_parameters():
        if name in trained:
            assert id(p) in held
        else:
            assert id(p) not in held and p.grad is None
            assert torch.equal(p.detach(), before[name]), name
    moved = [n for n in trained if not torch.equal(dict(model.named_parameters())[n].detach(), before[n])]
    assert any(n.startswith("model.layers.2.") for n in moved) and any(n.startswith("model.layers.3.") for n in moved)
    assert "model.norm.weight" in moved


def test_training_the_top_layers_finds_the_blocks_of_other_architectures_and_refuses_none() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from litstream.trainer.learner import train_top_layers

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=3, n_head=2))
    count = train_top_layers(model, 1)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(n.startswith(("transformer.h.2.", "transformer.ln_f.")) for n in trained)
    assert count == sum(p.numel() for n, p in model.named_parameters() if n in trained)
    train_top_layers(model, 10)  # more than there are: every block, still not the embeddings
    assert not model.transformer.wte.weight.requires_grad and model.transformer.h[0].attn.c_attn.weight.requires_grad
    with pytest.raises(ValueError):
        train_top_layers(model, 0)


def test_a_learner_training_the_top_layers_resumes_its_optimizer(tmp_path: Path) -> None:
    from litstream.trainer.learner import GrpoLearner, LearnerConfig

    policy = build_policy("tiny", seed=0)
    cfg = LearnerConfig(lr=1e-2, train_top_layers=1)
    learner = GrpoLearner(policy.model, policy.tokenizer, cfg)
    learner.step([_window(policy.tokenizer)])
    path = learner.save(tmp_path)
    again = GrpoLearner.resume(path, cfg)
    assert {n for n, p in again.model.named_parameters() if p.requires_grad} == {
        n for n, p in learner.model.named_parameters() if p.requires_grad}
    assert len(again.optimizer.state) == len(learner.optimizer.state) > 0
    other = GrpoLearner.resume(path, LearnerConfig(lr=1e-2, train_top_layers=2))  # another set: a fresh optimizer
    assert not other.optimizer.state
