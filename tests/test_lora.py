"""LoRA (trainer/lora.py): only the adapters train, a checkpoint holds the merged weights any engine serves, and
a resumed or restored run goes on from exactly the policy it left."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from litstream.trainer.checkpoint import load_checkpoint
from litstream.trainer.engines import TorchEngine
from litstream.trainer.grpo import pack, response_logprobs
from litstream.trainer.learner import GrpoLearner, LearnerConfig
from litstream.trainer.lora import has_lora
from litstream.trainer.policy import build_policy
from litstream.trainer.samples import Sample

torch.set_num_threads(1)
TOLERANCE = 1e-5


def _samples(seed: int = 0, n: int = 8) -> list[Sample]:
    policy = build_policy("tiny", seed=0)
    tok = policy.tokenizer
    gens = TorchEngine(policy.model, tok).generate([tok.encode("ax2=")] * n, 6, temperature=1.0, seed=seed)
    return [Sample(rollout_id=f"ro-{i}", attempt_id="at", index=0, group_id="g", policy_version=0,
                   prompt_token_ids=g.prompt_token_ids, response_token_ids=g.token_ids, response_logprobs=g.logprobs,
                   reward=float(i % 2), temperature=1.0) for i, g in enumerate(gens)]


def _logprobs(model: object, samples: list[Sample], pad: int) -> torch.Tensor:
    batch = pack([s.prompt_token_ids for s in samples], [s.response_token_ids for s in samples], pad)
    with torch.no_grad():
        return response_logprobs(model, batch)[0]


def test_only_the_adapters_train_and_the_checkpoint_serves_what_the_learner_holds(tmp_path: Path) -> None:
    policy = build_policy("tiny", seed=0)
    base = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    learner = GrpoLearner(policy.model, policy.tokenizer, LearnerConfig(lr=1e-2, lora_rank=4, temperature=1.0))
    assert has_lora(learner.model)
    trained = [n for n, p in learner.model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    samples = _samples()
    before = _logprobs(learner.model, samples, policy.tokenizer.pad_id)
    stats = learner.step([samples])
    assert stats.grad_norm > 0
    after = _logprobs(learner.model, samples, policy.tokenizer.pad_id)
    assert not torch.allclose(before, after)  # the policy moved
    for n, p in learner.model.get_base_model().named_parameters():
        if "lora_" not in n:  # the base weights did not
            assert torch.equal(p, base[n.replace(".base_layer", "")])

    path = learner.save(tmp_path / "ck")
    ck = load_checkpoint(path)
    assert not has_lora(ck.model) and ck.optimizer_state is None
    served = _logprobs(TorchEngine.from_checkpoint(path).model, samples, policy.tokenizer.pad_id)
    assert torch.allclose(served, after, atol=TOLERANCE, rtol=0)


def test_a_resumed_or_restored_run_goes_on_from_the_same_policy(tmp_path: Path) -> None:
    policy = build_policy("tiny", seed=0)
    cfg = LearnerConfig(lr=1e-2, lora_rank=4, temperature=1.0)
    learner = GrpoLearner(policy.model, policy.tokenizer, cfg)
    samples = _samples()
    learner.step([samples])
    path = learner.save(tmp_path / "ck")
    want = _logprobs(learner.model, samples, policy.tokenizer.pad_id)

    resumed = GrpoLearner.resume(path, cfg)
    assert has_lora(resumed.model) and resumed.version == learner.version
    assert torch.allclose(_logprobs(resumed.model, samples, policy.tokenizer.pad_id), want, atol=TOLERANCE, rtol=0)
    assert resumed.step([samples]).grad_norm > 0  # and it trains on

    fresh = GrpoLearner(build_policy("tiny", seed=0).model, policy.tokenizer, cfg)
    fresh.restore_weights(path)
    assert has_lora(fresh.model)
    assert torch.allclose(_logprobs(fresh.model, samples, policy.tokenizer.pad_id), want, atol=TOLERANCE, rtol=0)


def test_a_rank_below_one_is_refused() -> None:
    policy = build_policy("tiny", seed=0)
    with pytest.raises(ValueError, match="rank must be at least 1"):
        GrpoLearner(policy.model, policy.tokenizer, LearnerConfig(lora_rank=0))


def test_lora_brings_its_own_learning_rate_and_bounds() -> None:
    from litstream.trainer.algorithm import GRPO
    from litstream.trainer.defaults import SMOLLM2, check_lr

    assert GRPO(model="smollm2").lr == SMOLLM2.lr
    grpo = GRPO(model="smollm2", lora_rank=8)
    assert grpo.lr == pytest.approx(SMOLLM2.lr * 10) and "LoRA adapters of rank 8" in grpo.settings_text()
    assert "--lora-rank" in grpo.trainer_args()
    assert check_lr("smollm2", 1e-4, lora=True) is None and check_lr("smollm2", 1e-4) is not None
    assert check_lr("smollm2", 3e-3, lora=True)[0] == "refuse"  # type: ignore[index]
