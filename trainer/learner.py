"""The GRPO learner: one optimizer step per window of groups; the policy version goes up by one per step."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint import load_checkpoint, load_weights_into, save_checkpoint
from .constrained import compile_lark, replay_allowed
from .grpo import LossConfig, LossStats, TokenBatch, group_advantages, grpo_loss, pack, response_logprobs
from .lora import has_lora, servable, with_lora
from .policy import logits_width
from .samples import Sample
from .sampling import left_out_counts, temperature_of, why_left_out
from .signals import lr_factor
from .tokenizer import Tokenizer
from .windows import Group

log = logging.getLogger("litstream.trainer")


@dataclass
class LearnerConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    max_grad_norm: float | None = 1.0
    micro_batch_tokens: int = 4096  # padded (prompt + response) tokens per forward/backward: bounds memory
    adv_eps: float = 1e-6
    unbiased_std: bool = True
    with_entropy: bool = True
    # Optimizer steps per window over the same samples (PPO-style epochs): the clipped ratio against the generating
    # engine's log-probs keeps the later passes near the policy that sampled them.
    epochs: int = 1
    loss: LossConfig = field(default_factory=LossConfig)
    # Learning-rate schedule over optimizer steps (windows): linear warm-up, then constant, or a cosine / linear
    # decay to ``min_lr_ratio`` of ``lr`` at ``total_steps``.
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    min_lr_ratio: float = 0.1
    # The entropy bonus fades as the window's mean reward (clamped to [0, 1]) nears 1: full while nothing is
    # solved, when exploring is what finds the answer; nearly none once most answers are right, when a bonus that
    # no reward opposes would only push the policy off them.
    entropy_fade: bool = False
    # The step's learning rate times the share of the window's groups whose rewards differ (the rest carry no
    # policy gradient): Adam's step has the same size whatever the gradient's, so without this a window of
    # mostly solved groups moves the policy as far as one full of signal.
    lr_by_signal: bool = False
    # The temperature a sample was drawn at when its span recorded none (the one the trainer publishes). Each
    # sample is scored at its own (trainer/sampling.py): log-probs, ratio, KL and entropy are those of the logits
    # divided by it, the distribution the engine sampled from and reported its log-probs under.
    temperature: float = 1.0
    # Train only the top N transformer blocks and the final norm (None: every parameter). The embeddings, the
    # output layer and the blocks below are frozen: they get no gradient, the optimizer does not hold them, and
    # backward stops at the lowest trained block (trainable_top_layers).
    train_top_layers: int | None = None
    # LoRA (trainer/lora.py): adapters of this rank on every linear layer of the blocks train in place of the
    # model's weights (train_top_layers then does not apply); None: off. Alpha None: twice the rank.
    lora_rank: int | None = None
    lora_alpha: int | None = None
    # Where the learner trains ("cuda" on a GPU) and at what precision: "bf16" runs the forward and backward passes
    # under bfloat16 autocast, the weights and the optimizer staying float32 (the checkpoints too).
    device: str = "cpu"
    precision: str = "fp32"
    # Measure the KL to the starting policy (k3) on each step's first micro-batch even without a KL penalty:
    # how far the policy has moved, for the run's drift check (signals.drift_problem). One extra forward pass.
    watch_kl: bool = False


@dataclass
class StepStats:
    version: int  # the version this step produced
    step: int
    samples: int
    groups: int
    tokens: int  # response tokens in the loss
    sequence_tokens: int  # every token the step's forward passes read (prompts and responses of the trained samples)
    micro_batches: int
    loss: float
    clip_frac: float
    kl: float
    ratio_mean: float
    entropy: float
    grad_norm: float
    reward_mean: float
    adv_abs_mean: float
    lr: float  # the learning rate of this step (after the schedule)
    entropy_coef: float  # the entropy bonus of this step (after the fade)
    zero_adv_groups: int  # groups whose members all scored the same: no signal
    version_lag: float  # mean (version before the step - sample's policy version), versioned samples only
    seconds: float
    left_out: dict[str, int] = field(default_factory=dict)  # samples left out of the loss, by reason (sampling.py)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class GrpoLearner:
    def __init__(self, model: Any, tokenizer: Tokenizer, cfg: LearnerConfig | None = None,
                 ref_model: Any | None = None, version: int = 0, step: int = 0) -> None:
        self.cfg = cfg or LearnerConfig()
        if self.cfg.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be fp32 or bf16, not {self.cfg.precision!r}")
        self.device = torch.device(self.cfg.device)
        model = model.to(self.device)
        self.tokenizer = tokenizer
        self.version = version
        self.step_count = step
        if ref_model is None and (self.cfg.loss.kl_beta > 0 or self.cfg.watch_kl):
            ref_model = copy.deepcopy(model)  # the policy as it is now is the reference
        if self.cfg.lora_rank is not None:
            model = with_lora(model, self.cfg.lora_rank, self.cfg.lora_alpha)
        elif self.cfg.train_top_layers is not None:
            train_top_layers(model, self.cfg.train_top_layers)
        self.model = model
        self.reset_optimizer()
        self.ref_model = ref_model
        # This step's constrained samples: the grammar masks their tokens were drawn under (by id of the sample).
        self._grammar_masks: dict[int, list[tuple[int, np.ndarray[Any, Any]]]] = {}
        if ref_model is not None:
            ref_model.to(self.device).eval()
            for p in ref_model.parameters():
                p.requires_grad_(False)

    def reset_optimizer(self) -> None:
        """A fresh optimizer over the trained parameters (after their weights were replaced)."""
        trained = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trained, lr=self.cfg.lr, betas=self.cfg.betas,
                                           weight_decay=self.cfg.weight_decay)

    # --- training ----------------------------------------------------------------------------------------

    def step(self, groups: Sequence[Group] | Sequence[Sequence[Sample]]) -> StepStats:
        t0 = time.perf_counter()
        samples, gids = _flatten(groups)
        if not samples:
            raise ValueError("nothing to train on")
        rewards = [s.reward for s in samples]
        advs = group_advantages(rewards, gids, eps=self.cfg.adv_eps, unbiased=self.cfg.unbiased_std)
        by_group: dict[str, list[float]] = {}
        for s, g in zip(samples, gids):
            by_group.setdefault(g, []).append(s.reward)
        flat = sum(1 for rs in by_group.values() if max(rs) == min(rs))
        lr = self.cfg.lr * lr_factor(self.step_count, self.cfg.lr_schedule, self.cfg.total_steps,
                                     self.cfg.warmup_steps, self.cfg.min_lr_ratio)
        if self.cfg.lr_by_signal:
            lr *= 1.0 - flat / len(by_group)
        for pg in self.optimizer.param_groups:
            pg["lr"] = lr
        loss_cfg = self.cfg.loss
        if self.cfg.entropy_fade and loss_cfg.entropy_coef:
            solved = min(1.0, max(0.0, sum(rewards) / len(rewards)))
            loss_cfg = replace(loss_cfg, entropy_coef=loss_cfg.entropy_coef * (1.0 - solved))
        # Every reward counts in its group's advantages; only samples the learner can score take part in the loss.
        left_out = left_out_counts(samples, self.cfg.temperature)
        scored = [i for i, s in enumerate(samples) if why_left_out(s, self.cfg.temperature) is None]
        self._grammar_masks = self._replay_grammars([samples[i] for i in scored])
        refused = [i for i in scored if samples[i].grammars and id(samples[i]) not in self._grammar_masks]
        if refused:
            left_out["constrained"] += len(refused)
            scored = [i for i in scored if i not in refused]
        train, train_advs = [samples[i] for i in scored], [advs[i] for i in scored]
        total_tokens = sum(trained_tokens(s) for s in train)
        self.model.train()
        batches = self._micro_batches(train)
        prox = self._proximal_logprobs(train, batches) if self.cfg.loss.decoupled and train else None
        agg, loss_sum, grad_norm = LossStats(0, 0, 0, 0, 0), 0.0, 0.0
        for _ in range(max(self.cfg.epochs, 1) if train else 0):
            agg, loss_sum, grad_norm = self._update(train, train_advs, batches, total_tokens, prox, loss_cfg)
        self.model.eval()
        self._grammar_masks = {}
        lags = [self.version - s.policy_version for s in samples if s.policy_version is not None]
        self.version += 1
        self.step_count += 1
        n = max(agg.tokens, 1.0)
        return StepStats(
            version=self.version, step=self.step_count, samples=len(samples), groups=len(by_group),
            tokens=total_tokens, sequence_tokens=sum(len(s.prompt_token_ids) + len(s.response_token_ids) for s in train),
            micro_batches=len(batches), loss=loss_sum, clip_frac=agg.clipped / n,
            kl=agg.kl / max(agg.kl_tokens, 1.0), ratio_mean=agg.ratio / n, entropy=agg.entropy / n, grad_norm=grad_norm,
            reward_mean=sum(rewards) / len(rewards), adv_abs_mean=sum(abs(a) for a in advs) / len(advs),
            lr=lr, entropy_coef=loss_cfg.entropy_coef, zero_adv_groups=flat,
            version_lag=sum(lags) / len(lags) if lags else 0.0, seconds=time.perf_counter() - t0,
            left_out=dict(left_out))

    @torch.no_grad()
    def _proximal_logprobs(self, samples: list[Sample], batches: list[list[int]]) -> list[torch.Tensor]:
        """Each micro-batch's response log-probs under the policy as the step begins (decoupled PPO's anchor)."""
        out = []
        for idx in batches:
            batch = self._packed([samples[i] for i in idx])
            with self._autocast():
                out.append(response_logprobs(self.model, batch, temperature=self._temperatures(
                    [samples[i] for i in idx]))[0])
        return out

    def _update(self, samples: list[Sample], advs: list[float], batches: list[list[int]], total_tokens: int,
                prox: list[torch.Tensor] | None = None, loss_cfg: LossConfig | None = None,
                ) -> tuple[LossStats, float, float]:
        """One optimizer step over every micro-batch: the stats, the summed loss and the gradient norm."""
        self.optimizer.zero_grad(set_to_none=True)
        agg = LossStats(0, 0, 0, 0, 0)
        loss_sum = 0.0
        for k, idx in enumerate(batches):
            loss, st = self._micro_step([samples[i] for i in idx], [advs[i] for i in idx], total_tokens,
                                        prox[k] if prox is not None else None, loss_cfg or self.cfg.loss,
                                        with_ref=k == 0)
            loss.backward()
            loss_sum += float(loss.item())
            for name in ("tokens", "clipped", "ratio", "kl", "entropy", "kl_tokens"):
                setattr(agg, name, getattr(agg, name) + getattr(st, name))
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.cfg.max_grad_norm is not None:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm).item())
        else:
            grad_norm = float(torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return agg, loss_sum, grad_norm

    def _micro_step(self, samples: list[Sample], advs: list[float], normalizer: int,
                    prox: torch.Tensor | None = None, loss_cfg: LossConfig | None = None,
                    with_ref: bool = True) -> tuple[torch.Tensor, LossStats]:
        loss_cfg = loss_cfg or self.cfg.loss
        batch = self._packed(samples)
        temperatures = self._temperatures(samples)
        with self._autocast():
            logp, entropy = response_logprobs(self.model, batch, with_entropy=self.cfg.with_entropy,
                                              temperature=temperatures)
        old = torch.zeros_like(logp)
        for b, s in enumerate(samples):
            n = len(s.response_token_ids)
            if len(s.response_logprobs) == n:
                old[b, :n] = torch.tensor(list(s.response_logprobs), dtype=old.dtype)
            else:  # no engine log-probs: on-policy, ratio 1
                old[b, :n] = logp[b, :n].detach()
        ref = None
        if self.ref_model is not None and (loss_cfg.kl_beta > 0 or with_ref):  # a penalty needs it everywhere
            with torch.no_grad(), self._autocast():
                ref, _ = response_logprobs(self.ref_model, batch, temperature=temperatures)
        if entropy is not None and not loss_cfg.entropy_coef:
            entropy = entropy.detach()
        advantages = torch.tensor(advs, dtype=logp.dtype, device=logp.device)
        return grpo_loss(logp, old, advantages, batch.response_mask, loss_cfg,
                         ref_logp=ref, entropy=entropy, normalizer=float(max(normalizer, 1)), prox_logp=prox)

    @torch.no_grad()
    def score(self, samples: Sequence[Sample]) -> torch.Tensor:
        """The policy's log-probs [B, R] of each sample's response tokens, as the loss sees them (each at its own
        temperature, under its grammar's masks, on the learner's device and precision), as float32 on the CPU."""
        self._grammar_masks = self._replay_grammars(samples)
        try:
            with self._autocast():
                logp, _ = response_logprobs(self.model, self._packed(samples), temperature=self._temperatures(samples))
        finally:
            self._grammar_masks = {}
        return logp.float().cpu()

    def _replay_grammars(self, samples: Sequence[Sample]) -> dict[int, list[tuple[int, np.ndarray[Any, Any]]]]:
        """The replayed masks of each constrained sample (by id), leaving out those their grammar refuses."""
        return {id(s): m for s in samples if s.grammars and (m := self._replayed(s)) is not None}

    def _replayed(self, sample: Sample) -> list[tuple[int, np.ndarray[Any, Any]]] | None:
        """The masks each of ``sample``'s grammars allowed at its tokens, replayed (None, logged, when its tokens
        do not follow its grammar under this tokenizer: it was not decoded by this policy's endpoint)."""
        blocks = []
        try:
            for g in sample.grammars:
                compiled = compile_lark(self.tokenizer, g.lark, logits_width(self.model))
                blocks.append((g.start, replay_allowed(compiled, sample.response_token_ids[g.start:g.end])))
        except ValueError as exc:
            log.warning("a constrained sample of %s left out of the loss: %s", sample.rollout_id, exc)
            return None
        return blocks

    def _packed(self, samples: Sequence[Sample]) -> TokenBatch:
        return pack([s.prompt_token_ids for s in samples], [s.response_token_ids for s in samples],
                    self.tokenizer.pad_id, [s.loss_mask for s in samples],
                    [self._grammar_masks.get(id(s), []) for s in samples]).to(self.device)

    def _autocast(self) -> AbstractContextManager[Any]:
        if self.cfg.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _temperatures(self, samples: Sequence[Sample]) -> list[float]:
        """Each sample's own temperature (the published one where its span recorded none)."""
        return [temperature_of(s, self.cfg.temperature) for s in samples]

    def _micro_batches(self, samples: list[Sample]) -> list[list[int]]:
        """Greedy packing, longest first, so that n * longest <= micro_batch_tokens (at least one each)."""
        order = sorted(range(len(samples)), key=lambda i: -_length(samples[i]))
        out: list[list[int]] = []
        cur: list[int] = []
        for i in order:
            longest = _length(samples[cur[0]]) if cur else _length(samples[i])
            if cur and (len(cur) + 1) * longest > self.cfg.micro_batch_tokens:
                out.append(cur)
                cur = []
            cur.append(i)
        if cur:
            out.append(cur)
        return out

    # --- persistence -------------------------------------------------------------------------------------

    def save(self, root: str | Path, keep_last: int | None = 3, extra: dict[str, Any] | None = None,
             keep_every: int | None = None) -> Path:
        # With LoRA the checkpoint holds the merged weights, and no optimizer state: a resumed run starts fresh
        # adapters on them (trainer/lora.py), which the saved moments would not fit.
        lora = has_lora(self.model)
        return save_checkpoint(root, servable(self.model), self.tokenizer, self.version, step=self.step_count,
                               optimizer=None if lora else self.optimizer, extra=extra, keep_last=keep_last,
                               keep_every=keep_every, temperature=self.cfg.temperature)

    def restore_weights(self, source: str | Path) -> None:
        """The weights of checkpoint ``source`` in place of the model's (fresh adapters under LoRA), with a fresh
        optimizer: its moments belong to the weights left behind."""
        if has_lora(self.model):
            base = self.model.unload()  # the adapters removed, not merged
            load_weights_into(base, source)
            self.model = with_lora(base, int(self.cfg.lora_rank or 1), self.cfg.lora_alpha)
        else:
            load_weights_into(self.model, source)
        self.reset_optimizer()

    @classmethod
    def resume(cls, path: str | Path, cfg: LearnerConfig | None = None, ref_model: Any | None = None,
               ) -> GrpoLearner:
        """From a checkpoint directory or root (latest): weights, optimizer state, version and step."""
        ck = load_checkpoint(path)
        learner = cls(ck.model, ck.tokenizer, cfg, ref_model=ref_model, version=ck.version, step=ck.step)
        if ck.optimizer_state is not None:
            try:
                learner.optimizer.load_state_dict(ck.optimizer_state)
            except ValueError as exc:  # saved while another set of parameters was trained
                log.warning("optimizer state of %s not restored (%s): it starts afresh", path, exc)
        return learner


def transformer_blocks(model: Any) -> Any:
    """The stack of transformer blocks of a Hugging Face causal LM (Llama and its kin: ``model.model.layers``;
    GPT-2 style: ``transformer.h``)."""
    for path in (("model", "layers"), ("transformer", "h"), ("gpt_neox", "layers"), ("model", "decoder", "layers")):
        obj = _attribute_at(model, path)
        if isinstance(obj, torch.nn.ModuleList):
            return obj
    raise ValueError(f"cannot find the transformer blocks of {type(model).__name__}")


def final_norm(model: Any) -> torch.nn.Module | None:
    """The norm after the last block, if the model has one where Llama or GPT-2 keep it."""
    for path in (("model", "norm"), ("transformer", "ln_f"), ("gpt_neox", "final_layer_norm"),
                 ("model", "decoder", "final_layer_norm")):
        obj = _attribute_at(model, path)
        if isinstance(obj, torch.nn.Module):
            return obj
    return None


def _attribute_at(obj: Any, path: tuple[str, ...]) -> Any:
    """``obj.a.b...`` along ``path``, or None where an attribute is missing."""
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def train_top_layers(model: Any, n: int) -> int:
    """Freeze every parameter of ``model`` but those of its top ``n`` transformer blocks and its final norm
    (``requires_grad`` False: no gradient is computed for them and, below the lowest trained block, none flows
    at all). ``n`` at least the number of blocks trains every block, the embeddings and the output layer stay
    frozen. Returns the number of parameters left to train."""
    if n < 1:
        raise ValueError(f"train_top_layers must be at least 1, not {n}")
    blocks = transformer_blocks(model)
    for p in model.parameters():
        p.requires_grad_(False)
    for block in list(blocks)[len(blocks) - min(n, len(blocks)):]:
        for p in block.parameters():
            p.requires_grad_(True)
    norm = final_norm(model)
    if norm is not None:
        for p in norm.parameters():
            p.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def trained_tokens(s: Sample) -> int:
    """The response tokens that take part in the loss (a trajectory's sampled ones)."""
    return len(s.response_token_ids) if s.loss_mask is None else sum(s.loss_mask)


def _length(s: Sample) -> int:
    return len(s.prompt_token_ids) + len(s.response_token_ids)


def _flatten(groups: Sequence[Group] | Sequence[Sequence[Sample]]) -> tuple[list[Sample], list[str]]:
    samples: list[Sample] = []
    gids: list[str] = []
    for g in groups:
        members = g.samples if isinstance(g, Group) else list(g)
        for s in members:
            samples.append(s)
            gids.append(s.group_id)
    return samples, gids
