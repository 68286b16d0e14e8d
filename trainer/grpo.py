"""GRPO in plain torch: group-normalised advantages, per-token log-probs of responses, the clipped loss.

Conventions (those of TRL's GRPOTrainer and verl):

* advantage ``A_i = (r_i - mean_g) / (std_g + eps)`` over the members of i's group, with the *sample* standard
  deviation (n - 1 in the denominator, as ``torch.std`` computes it); a group of one has no spread, so its
  member's advantage is 0 (it contributes no policy gradient);
* log-probs are those of the distribution the tokens were sampled from: the logits divided by the sampling
  temperature (TRL and verl do the same); at another temperature the ratio would compare two other policies
  and the gradient would not be the sampling policy's;
* the ratio is taken against the log-probs the generating engine reported for the sampled tokens (old
  log-probs), clipped at ``1 +- eps`` (0.2), with an optional dual clip ``c`` (verl: 3) bounding the loss of
  negative-advantage tokens whose ratio exploded;
* the KL to a reference policy is the k3 estimator ``exp(ref - logp) - (ref - logp) - 1``, weight beta (0 by
  default);
* the loss is the token mean over the whole batch (every response token weighs the same).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .policy import takes_logits_to_keep


def group_advantages(rewards: Sequence[float], group_ids: Sequence[Hashable], eps: float = 1e-6,
                     unbiased: bool = True) -> list[float]:
    """Per-sample advantages, normalised within each group (see the module's conventions)."""
    if len(rewards) != len(group_ids):
        raise ValueError("rewards and group_ids differ in length")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        n = len(idx)
        if n < 2:
            continue
        rs = [float(rewards[i]) for i in idx]
        mean = sum(rs) / n
        var = sum((r - mean) ** 2 for r in rs) / (n - 1 if unbiased else n)
        std = math.sqrt(var)
        for i, r in zip(idx, rs):
            out[i] = (r - mean) / (std + eps)
    return out


@dataclass
class TokenBatch:
    """Prompt+response sequences, right-padded, and where each response sits."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    prompt_lens: torch.Tensor  # [B]
    response_mask: torch.Tensor  # [B, R]: 1 on real response tokens
    response_ids: torch.Tensor  # [B, R] (pad where masked)
    # Response positions decoded under a grammar: their sequence [N], their position in the response [N], and the
    # tokens the grammar allowed there [N, V]; scored under the masked, renormalised distribution they were drawn from.
    allowed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def to(self, device: torch.device | str) -> TokenBatch:
        allowed = tuple(t.to(device) for t in self.allowed) if self.allowed is not None else None
        return TokenBatch(self.input_ids.to(device), self.attention_mask.to(device), self.prompt_lens.to(device),
                          self.response_mask.to(device), self.response_ids.to(device), allowed)  # type: ignore[arg-type]


def pack(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int,
         loss_masks: Sequence[Sequence[int] | None] | None = None,
         grammar_masks: Sequence[Sequence[tuple[int, np.ndarray[Any, Any]]]] | None = None) -> TokenBatch:
    """``loss_masks``: per response, 1 where a token takes part in the loss (None: all of them; trajectories
    mask the tokens between turns). ``grammar_masks``: per response, the blocks of its tokens decoded under a grammar,
    each ``(first position, the allowed tokens [n, V])`` as ``trainer.constrained.replay_allowed`` gives them."""
    if len(prompts) != len(responses):
        raise ValueError("prompts and responses differ in length")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from it)")
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
    B, L = len(seqs), max(len(s) for s in seqs)
    R = max(1, max(len(r) for r in responses))
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    resp_ids = torch.full((B, R), pad_id, dtype=torch.long)
    resp_mask = torch.zeros((B, R), dtype=torch.float32)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        n = len(p) + len(r)
        input_ids[b, :n] = torch.tensor(list(p) + list(r), dtype=torch.long)
        attn[b, :n] = 1
        if r:
            resp_ids[b, : len(r)] = torch.tensor(list(r), dtype=torch.long)
            mask = loss_masks[b] if loss_masks is not None else None
            resp_mask[b, : len(r)] = torch.tensor(list(mask), dtype=torch.float32) if mask is not None else 1.0
    prompt_lens = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return TokenBatch(input_ids, attn, prompt_lens, resp_mask, resp_ids, _allowed(grammar_masks or []))


def _allowed(grammar_masks: Sequence[Sequence[tuple[int, np.ndarray[Any, Any]]]],
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    rows_b: list[int] = []
    rows_j: list[int] = []
    blocks: list[np.ndarray[Any, Any]] = []
    for b, found in enumerate(grammar_masks):
        for start, rows in found:
            rows_b += [b] * len(rows)
            rows_j += range(start, start + len(rows))
            blocks.append(rows)
    if not blocks:
        return None
    return (torch.tensor(rows_b, dtype=torch.long), torch.tensor(rows_j, dtype=torch.long),
            torch.from_numpy(np.concatenate(blocks)))


def response_logprobs(model: Any, batch: TokenBatch, with_entropy: bool = False,
                      temperature: float | Sequence[float] = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, R] of each response token given everything before it, under the softmax of the logits
    divided by ``temperature`` (the distribution the engine sampled from; <= 0, greedy, scores untempered): one
    for the batch, or one per sequence (each sample scored as it was drawn). Optionally the entropy [B, R] of
    that distribution. Masked positions hold 0."""
    L = batch.input_ids.shape[1]
    # The token at position t is predicted by the logits at t - 1: response token j by position plen - 1 + j. A
    # model that takes ``logits_to_keep`` computes the output layer from the shortest prompt's last position on
    # only, not over every prompt token (the output layer is the largest single matrix of a small LM).
    first = int(batch.prompt_lens.min()) - 1
    kwargs = {"logits_to_keep": L - first} if takes_logits_to_keep(model) else {}
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **kwargs).logits  # [B, L', V]
    B, kept, V = logits.shape
    offset = L - kept  # logits[:, i] are those of position offset + i
    R = batch.response_ids.shape[1]
    steps = torch.arange(R, device=batch.prompt_lens.device).unsqueeze(0)  # on the batch's device, as every operand
    pos = (batch.prompt_lens.unsqueeze(1) - 1 + steps).clamp(max=L - 1) - offset  # [B, R]
    picked = logits.gather(1, pos.unsqueeze(-1).expand(B, R, V)).float()  # [B, R, V]
    picked = _tempered(picked, temperature)
    if batch.allowed is not None:
        at_b, at_j, allowed = batch.allowed
        picked = picked.index_put((at_b, at_j), picked[at_b, at_j].masked_fill(~allowed, float("-inf")))
    logp_all = F.log_softmax(picked, dim=-1)
    logp = logp_all.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1) * batch.response_mask
    entropy = None
    if with_entropy:
        safe = torch.where(logp_all.isfinite(), logp_all, 0.0)  # a masked-out token adds 0 (and no NaN gradient)
        entropy = -(safe.exp() * safe).sum(-1) * batch.response_mask
    return logp, entropy


def _tempered(logits: torch.Tensor, temperature: float | Sequence[float]) -> torch.Tensor:
    """``logits`` [B, R, V] divided by the temperature, per sequence when given one each (<= 0: untempered)."""
    if isinstance(temperature, (int, float)):
        return logits / temperature if temperature > 0 and temperature != 1.0 else logits
    if len(temperature) != logits.shape[0]:
        raise ValueError(f"{len(temperature)} temperatures for {logits.shape[0]} sequences")
    t = torch.tensor([x if x > 0 else 1.0 for x in temperature], dtype=logits.dtype, device=logits.device)
    return logits / t.view(-1, 1, 1)


@dataclass
class LossConfig:
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # asymmetric upper clip (DAPO's clip-higher); None: = clip_eps
    dual_clip: float | None = None  # c > 1, e.g. 3.0; None: off
    kl_beta: float = 0.0
    entropy_coef: float = 0.0  # a bonus on the policy's entropy (needs the entropy with its gradient)
    # Decoupled PPO (for stale samples): clip against the policy as it was when the step began (the proximal
    # policy), and correct for the generating engine's policy with a separate importance weight, capped here.
    # Samples a few versions old then still move the policy; with plain PPO their ratios start outside the clip.
    decoupled: bool = False
    max_behavior_weight: float = 5.0


@dataclass
class LossStats:
    """Token sums over the batch given to ``grpo_loss`` (so micro-batches add up); divide by ``tokens``."""

    tokens: float
    clipped: float
    ratio: float
    kl: float
    entropy: float
    kl_tokens: float = 0.0  # the tokens the KL was measured on (a reference policy's log-probs were given)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              cfg: LossConfig | None = None, ref_logp: torch.Tensor | None = None,
              entropy: torch.Tensor | None = None, normalizer: float | None = None,
              prox_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, LossStats]:
    """The GRPO loss: ``sum over tokens of per-token loss / normalizer``.

    ``logp``, ``old_logp``, ``ref_logp``, ``mask``: [B, R]; ``advantages``: [B] (one per sequence).
    ``normalizer`` defaults to this batch's token count; a micro-batched step passes the whole batch's count so
    that the summed gradients equal those of one token-mean over everything. With ``prox_logp`` (decoupled PPO)
    the ratio is taken against it and each token is weighted by ``exp(prox_logp - old_logp)``, capped at
    ``cfg.max_behavior_weight``.
    """
    cfg = cfg or LossConfig()
    mask = mask.float()
    adv = advantages.unsqueeze(1).to(logp.dtype)
    lo, hi = 1.0 - cfg.clip_eps, 1.0 + (cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps)
    anchor = prox_logp if prox_logp is not None else old_logp
    log_ratio = (logp - anchor) * mask  # masked positions: ratio exactly 1
    ratio = torch.exp(log_ratio)
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(lo, hi))
    if prox_logp is not None:
        behavior = torch.exp((prox_logp - old_logp) * mask).clamp(max=cfg.max_behavior_weight)
        pg = pg * behavior.detach()
    if cfg.dual_clip is not None:
        if cfg.dual_clip <= 1.0:
            raise ValueError("dual_clip must exceed 1")
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * cfg.dual_clip), pg)
    per_token = pg
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        d = (ref_logp - logp) * mask
        kl = torch.exp(d) - d - 1.0
        if cfg.kl_beta:
            per_token = per_token + cfg.kl_beta * kl
    if cfg.entropy_coef and entropy is not None:
        per_token = per_token - cfg.entropy_coef * entropy
    n_tokens = float(mask.sum().item())
    norm = normalizer if normalizer is not None else max(n_tokens, 1.0)
    loss = (per_token * mask).sum() / norm
    with torch.no_grad():
        clipped = ((ratio < lo) & (adv < 0)) | ((ratio > hi) & (adv > 0))
        stats = LossStats(
            tokens=n_tokens,
            clipped=float((clipped.float() * mask).sum().item()),
            ratio=float((ratio * mask).sum().item()),
            kl=float((kl * mask).sum().item()), kl_tokens=n_tokens if ref_logp is not None else 0.0,
            entropy=float((entropy.detach() * mask).sum().item()) if entropy is not None else 0.0,
        )
    return loss, stats
