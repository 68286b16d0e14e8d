"""Each policy's training defaults, in one place: what ``litstream train``, ``Trainer.fit`` (GRPO) and
``litstream demo`` use when the user gives nothing, and the learning rates that would wreck a pretrained model.

* ``tiny``: a randomly initialised 0.5M-parameter byte-level Llama. It learns from scratch, so it takes a large
  learning rate; measured on the toy task (``make demo``, docs/training.md).
* ``smollm2``: SmolLM2-135M-Instruct, pretrained. Measured: a learning rate of 1e-3 turned its answers into strings
  of random words after the first step; 5e-6 raised the mean train reward from 0.17 to 0.35 in four versions, and
  1e-5 at temperature 0.5 raised the held-out reward on word problems from 0.16 to 0.83 in 15 versions
  (docs/training.md). Only the top 15 of its 30 transformer blocks train: the step takes less than half as long.
* any other name: a Hugging Face causal LM (a local directory): pretrained, so the same small learning rate and
  the same refusal as SmolLM2; every parameter trains (how many blocks to freeze was measured on SmolLM2 only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import toy_task


@dataclass(frozen=True)
class ModelDefaults:
    model: str
    pretrained: bool
    lr: float
    temperature: float  # sampling temperature the trainer publishes with each version (agents may read it)
    group_size: int  # rollouts per task (a GRPO group)
    groups_per_step: int  # groups per training window
    epochs: int  # optimizer steps per window on its samples
    max_tokens: int  # response length the trainer publishes with each version
    entropy_coef: float
    lr_by_signal: bool  # the step's learning rate times the share of groups with signal (LearnerConfig)
    train_top_layers: int | None  # train only the top N transformer blocks and the final norm (None: everything)
    minutes: float  # a first run's time budget
    max_versions: int  # a first run's version budget
    max_lr: float | None  # a learning rate above this is refused (None: any)
    warn_lr: float | None  # above this (and up to max_lr), a warning

    def budget_text(self) -> str:
        return f"{self.minutes:g} minutes or {self.max_versions} versions"


TINY = ModelDefaults(model="tiny", pretrained=False, lr=1e-3, temperature=1.0, group_size=8, groups_per_step=16,
                     epochs=4, max_tokens=toy_task.MAX_NEW_TOKENS, entropy_coef=0.03, lr_by_signal=True,
                     train_top_layers=None, minutes=10.0, max_versions=300, max_lr=None, warn_lr=1e-2)
# Pretrained: the learning rate and temperature measured to work, one optimizer step per window (several passes
# over the same samples move a pretrained model a long way), no entropy bonus (it already samples diverse text),
# room for a sentence of answer, the upper half of the blocks trained (the step bench in docs/training.md).
SMOLLM2 = ModelDefaults(model="smollm2", pretrained=True, lr=1e-5, temperature=0.5, group_size=8,
                        groups_per_step=8, epochs=1, max_tokens=128, entropy_coef=0.0, lr_by_signal=False,
                        train_top_layers=15, minutes=30.0, max_versions=100, max_lr=1e-4, warn_lr=3e-5)


def defaults_for(model: str) -> ModelDefaults:
    """The defaults of ``tiny``, ``smollm2``, or any other (a Hugging Face causal LM directory: pretrained)."""
    if model == "tiny":
        return TINY
    if model == "smollm2":
        return SMOLLM2
    return replace(SMOLLM2, model=model, train_top_layers=None)  # its blocks are not SmolLM2's: all of them train


# LoRA's learning rate, as a multiple of the model's full fine-tuning one: low-rank updates move the weights less
# per step, and LoRA's best learning rate is measured at about ten times full fine-tuning's across model sizes
# (Schulman et al., "LoRA Without Regret", 2025). The refuse and warn bounds scale with it.
LORA_LR_FACTOR = 10.0


def with_lora_lr(d: ModelDefaults) -> ModelDefaults:
    """``d`` with its learning rate and bounds for LoRA training."""
    scale = LORA_LR_FACTOR
    return replace(d, lr=d.lr * scale, max_lr=d.max_lr * scale if d.max_lr is not None else None,
                   warn_lr=d.warn_lr * scale if d.warn_lr is not None else None)


def check_lr(model: str, lr: float, lora: bool = False) -> tuple[str, str] | None:
    """``("refuse", why)`` for a learning rate that would wreck the model, ``("warn", why)`` for one well above
    its default, None when it is fine (under LoRA, against LoRA's default and bounds)."""
    d = with_lora_lr(defaults_for(model)) if lora else defaults_for(model)
    kind = "a pretrained model" if d.pretrained else "this model"
    if lr <= 0:
        return "refuse", f"learning rate {lr:g}: it must be positive"
    if d.max_lr is not None and lr > d.max_lr:
        return "refuse", (f"learning rate {lr:g} would wreck {kind} ({model}): steps that large overwrite what it "
                          f"learned in pretraining (measured on SmolLM2-135M: 1e-3 turned its answers into random "
                          f"words after one step, 5e-6 and 1e-5 trained). Use at most {d.max_lr:g}; the default is "
                          f"{d.lr:g}.")
    if d.warn_lr is not None and lr > d.warn_lr:
        return "warn", (f"learning rate {lr:g} is {lr / d.lr:.0f}x the default for {model} ({d.lr:g}); if the "
                        f"reward falls or the answers turn to noise, lower it")
    return None
