"""Checkpoints and the learner: round trip, exact resume, pruning, micro-batching, versions."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from litstream.trainer.checkpoint import (
    checkpoint_extra,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from litstream.trainer.grpo import LossConfig
from litstream.trainer.learner import GrpoLearner, LearnerConfig
from litstream.trainer.policy import build_policy, parameter_count
from litstream.trainer.tokenizer import ByteTokenizer
from litstream.trainer.windows import Sample

torch.set_num_threads(1)


def groups(seed: int, n_groups: int = 3, size: int = 4) -> list[list[Sample]]:
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        prompt = (257, 97 + g, 120, 61)
        members = []
        for i in range(size):
            resp = tuple(rng.randrange(0, 256) for _ in range(rng.randint(1, 5)))
            lps = tuple(-5.5 + rng.uniform(-0.1, 0.1) for _ in resp)
            members.append(Sample(f"ro-{seed}-{g}-{i}", "at-1", 0, f"g{seed}-{g}", 0, prompt, resp, lps,
                                  rng.random()))
        out.append(members)
    return out


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_tiny_policy_is_small_untied_and_seeded() -> None:
    a, b, c = build_policy("tiny", seed=1), build_policy("tiny", seed=1), build_policy("tiny", seed=2)
    assert 300_000 < parameter_count(a.model) < 700_000
    assert a.model.config.tie_word_embeddings is False
    assert a.model.lm_head.weight.data_ptr() != a.model.model.embed_tokens.weight.data_ptr()
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    assert not torch.equal(a.model.lm_head.weight, c.model.lm_head.weight)


def test_byte_tokenizer_and_its_hf_export_agree(tmp_path: Path) -> None:
    tok = ByteTokenizer()
    text = "cx2= é€\n"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id and tok.decode(ids) == text
    assert tok.decode([*ids, tok.eos_id], skip_special=False).endswith("</s>")
    hf = tok.to_hf()
    assert hf.encode(text, add_special_tokens=False) == ids[1:]
    assert hf.convert_tokens_to_ids(["<pad>", "<s>", "</s>"]) == [tok.pad_id, tok.bos_id, tok.eos_id]


def test_checkpoint_round_trip_bit_equal(tmp_path: Path) -> None:
    p = build_policy("tiny", seed=0)
    path = save_checkpoint(tmp_path, p.model, p.tokenizer, version=0, extra={"positions": {"0": 12}})
    assert path == tmp_path / "v0" and latest_checkpoint(tmp_path) == path
    assert "lm_head.weight" in load_file(str(path / "model.safetensors"))
    assert checkpoint_extra(path) == {"positions": {"0": 12}}
    ck = load_checkpoint(tmp_path)  # a root resolves to its latest checkpoint
    assert ck.version == 0 and isinstance(ck.tokenizer, ByteTokenizer)
    assert ck.model.config.tie_word_embeddings is False
    for k, v in p.model.state_dict().items():
        assert torch.equal(v, ck.model.state_dict()[k]), k
    assert not [q for q in tmp_path.iterdir() if q.name.startswith(".")]  # no temporary left behind


def test_a_hugging_face_model_directory_loads_as_version_0(tmp_path: Path) -> None:
    """What `litstream train --algorithm baseline --model DIR` serves: a model saved by Hugging Face alone, with
    no trainer state beside it."""
    p = build_policy("tiny", seed=0)
    p.model.save_pretrained(tmp_path)
    p.tokenizer.to_hf().save_pretrained(tmp_path)
    ck = load_checkpoint(tmp_path)
    assert (ck.version, ck.step, ck.optimizer_state) == (0, 0, None)
    assert all(torch.equal(v, ck.model.state_dict()[k]) for k, v in p.model.state_dict().items())
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nothing")


def test_keep_last_prunes_old_checkpoints(tmp_path: Path) -> None:
    p = build_policy("tiny", seed=0)
    for v in range(5):
        save_checkpoint(tmp_path, p.model, p.tokenizer, version=v, keep_last=2)
    assert [v for v, _ in list_checkpoints(tmp_path)] == [3, 4]


def test_tied_embeddings_are_refused(tmp_path: Path) -> None:
    p = build_policy("tiny", seed=0)
    p.model.lm_head.weight = p.model.model.embed_tokens.weight
    with pytest.raises(ValueError, match="tied"):
        save_checkpoint(tmp_path, p.model, p.tokenizer, version=0)


def test_resume_restores_weights_optimizer_and_version_exactly(tmp_path: Path) -> None:
    p = build_policy("tiny", seed=0)
    cfg = LearnerConfig(lr=1e-2)
    a = GrpoLearner(p.model, p.tokenizer, cfg)
    s1 = a.step(groups(1))
    assert s1.version == 1 and a.version == 1 and s1.samples == 12 and s1.groups == 3
    a.save(tmp_path)
    s2 = a.step(groups(2))
    b = GrpoLearner.resume(tmp_path, cfg)
    assert b.version == 1 and b.step_count == 1
    s2b = b.step(groups(2))
    assert s2b.loss == s2.loss and s2b.grad_norm == s2.grad_norm and s2b.version == 2
    pa, pb = params(a.model), params(b.model)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_a_learners_checkpoint_serves_at_the_temperature_it_trained_at(tmp_path: Path) -> None:
    from litstream.workers.policy_server.sampling_defaults import generation_config_defaults

    p = build_policy("tiny", seed=0)
    path = GrpoLearner(p.model, p.tokenizer, LearnerConfig(temperature=0.5)).save(tmp_path / "warm")
    assert generation_config_defaults(path).temperature == 0.5  # what `--model <checkpoint>` samples with
    greedy = GrpoLearner(p.model, p.tokenizer, LearnerConfig(temperature=0.0)).save(tmp_path / "greedy")
    assert generation_config_defaults(greedy) == generation_config_defaults(None)  # do_sample false: none named
    assert not (save_checkpoint(tmp_path / "plain", p.model, p.tokenizer, 0) / "generation_config.json").exists()


def test_micro_batching_matches_one_batch() -> None:
    data = groups(5)
    big = GrpoLearner(build_policy("tiny", seed=0).model, ByteTokenizer(), LearnerConfig(micro_batch_tokens=10_000))
    small = GrpoLearner(build_policy("tiny", seed=0).model, ByteTokenizer(), LearnerConfig(micro_batch_tokens=20))
    for learner in (big, small):  # plain SGD: the update is the gradient (Adam's first step is ~sign(g))
        learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=1.0)
    sb, ss = big.step(data), small.step(data)
    assert sb.micro_batches == 1 and ss.micro_batches > 3
    assert ss.loss == pytest.approx(sb.loss, abs=1e-6) and ss.grad_norm == pytest.approx(sb.grad_norm, rel=1e-5)
    pa, pb = params(big.model), params(small.model)
    assert all(torch.allclose(pa[k], pb[k], atol=1e-6) for k in pa)


def test_kl_reference_is_frozen_and_reported() -> None:
    p = build_policy("tiny", seed=0)
    learner = GrpoLearner(p.model, p.tokenizer, LearnerConfig(lr=1e-2, loss=LossConfig(kl_beta=0.1)))
    assert learner.ref_model is not None
    first = learner.step(groups(1))
    assert first.kl == pytest.approx(0.0, abs=1e-7)  # policy == reference before any update
    second = learner.step(groups(2))
    assert second.kl > 0
    assert not any(q.requires_grad for q in learner.ref_model.parameters())
