"""Rejection-sampling fine-tuning (RFT): supervised fine-tuning on the best trajectories a run already has in the
log, with no new rollouts; a warm start for GRPO (``litstream train --warm-start RUN``).

The trajectories are ``litstream export``'s records (trainer/export.py): token ids as the policy served them and
the loss mask of the tokens the model chose, so the fine-tuning sees exactly what the model produced and learns
only those tokens: not the tool results, the template glue between turns, or a call ``tool_choice`` forced. Selecting them is pure
(:func:`select_best`); the fine-tuning is TRL's ``SFTTrainer`` on its pre-tokenized prompt-completion format
(``input_ids`` and ``completion_mask``), on the model's own trainable blocks.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TRAIN_MODE = "train"  # validation rollouts stay held out: they never train


@dataclass(frozen=True)
class RftConfig:
    # A trajectory trains when its reward is at least this (the weather and arithmetic examples: 1.0 = solved)
    min_reward: float = 1.0
    # Distinct trajectories per task at most, newest policy versions first: a task the policy solves often does
    # not outweigh the others. One pass over one per task keeps the fine-tuning short on a CPU (SmolLM2 on 2
    # cores: about 4 s per trajectory of ~350 tokens, forward and backward)
    per_task: int = 1
    epochs: int = 1
    # Larger than GRPO's 1e-5 (SmolLM2's): a few steps of supervised targets the policy already samples, which
    # sharpens it towards its successes rather than moving it somewhere new
    lr: float = 5e-5
    batch_size: int = 8
    max_length: int = 1024  # tokens of one trajectory; longer ones are left out (counted)


@dataclass(frozen=True)
class Selection:
    """What :func:`select_best` kept out of a run's records, and why the others were left."""

    rows: list[dict[str, list[int]]]  # {"input_ids", "completion_mask"}: TRL's pre-tokenized format
    records: int  # every record read
    kept: int
    tasks: int  # tasks with at least one kept trajectory
    left_out: dict[str, int]  # reason -> records

    def text(self) -> str:
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(self.left_out.items()) if n)
        return (f"{self.kept} of {self.records} trajectories over {self.tasks} tasks"
                + (f" (left out: {why})" if why else ""))


def select_best(records: Iterable[dict[str, Any]], cfg: RftConfig = RftConfig()) -> Selection:
    """The training trajectories with a reward of at least ``cfg.min_reward``, at most ``cfg.per_task`` distinct
    ones per task (newest versions first), as TRL rows: prompt and response ids joined, the completion mask 0 on
    the prompt and on what the model did not choose."""
    left: dict[str, int] = {"not training rollouts": 0, "below the reward": 0, "turns that do not join": 0,
                            "duplicates or past per_task": 0, "too long": 0, "no token the model chose": 0}
    good: list[dict[str, Any]] = []
    total = 0
    for r in records:
        total += 1
        reward = r.get("reward")
        if r.get("mode") != TRAIN_MODE:
            left["not training rollouts"] += 1
        elif reward is None or not math.isfinite(reward) or reward < cfg.min_reward:
            left["below the reward"] += 1
        elif not r.get("prompt_token_ids") or not r.get("response_token_ids"):
            left["turns that do not join"] += 1
        elif len(r["prompt_token_ids"]) + len(r["response_token_ids"]) > cfg.max_length:
            left["too long"] += 1
        elif r.get("response_loss_mask") is not None and not any(r["response_loss_mask"]):
            left["no token the model chose"] += 1  # e.g. only a call forced by tool_choice (trainer/export.py)
        else:
            good.append(r)
    good.sort(key=lambda r: -(r.get("policy_version") or 0))
    rows: list[dict[str, list[int]]] = []
    seen: dict[str, set[tuple[int, ...]]] = {}
    for r in good:
        responses = seen.setdefault(str(r.get("task_id")), set())
        response = tuple(r["response_token_ids"])
        if response in responses or len(responses) >= cfg.per_task:
            left["duplicates or past per_task"] += 1
            continue
        responses.add(response)
        rows.append(_row(r))
    return Selection(rows=rows, records=total, kept=len(rows), tasks=sum(1 for s in seen.values() if s),
                     left_out=left)


def _row(r: dict[str, Any]) -> dict[str, list[int]]:
    prompt, response = list(r["prompt_token_ids"]), list(r["response_token_ids"])
    mask = r.get("response_loss_mask") or [1] * len(response)
    return {"input_ids": prompt + response, "completion_mask": [0] * len(prompt) + [int(m) for m in mask]}


@dataclass(frozen=True)
class FineTuned:
    checkpoint: Path
    steps: int
    seconds: float
    first_loss: float | None
    last_loss: float | None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "checkpoint": str(self.checkpoint)}


def fine_tune(model_name: str, rows: Sequence[dict[str, list[int]]], out: Path, cfg: RftConfig = RftConfig(),
              train_top: int | None = None, seed: int = 0,
              progress: Callable[[str], None] | None = None) -> FineTuned:
    """Fine-tune ``model_name`` (tiny, smollm2 or a Hugging Face directory) on ``rows`` with TRL's SFTTrainer and
    save the result as a version-0 checkpoint in ``out`` (what ``litstream process trainer --init-from`` starts
    from). ``train_top``: only the top N transformer blocks train, as in GRPO (None: every parameter)."""
    from .checkpoint import save_checkpoint
    from .learner import train_top_layers
    from .policy import build_policy

    if not rows:
        raise ValueError("no trajectories to fine-tune on")
    policy = build_policy(model_name, seed=seed)  # type: ignore[arg-type]
    model, tokenizer = policy.model, policy.tokenizer
    if train_top:
        train_top_layers(model, train_top)
    hf_tok = tokenizer.tok if hasattr(tokenizer, "tok") else tokenizer.to_hf()  # type: ignore[attr-defined]
    if hf_tok.pad_token_id is None:
        hf_tok.pad_token = hf_tok.eos_token
    started = time.monotonic()
    model, losses = _sft(model, hf_tok, rows, cfg, seed, progress)
    for p in model.parameters():
        p.requires_grad_(True)  # the GRPO trainer decides what trains from here
    model.eval()
    path = save_checkpoint(out, model, tokenizer, version=0, extra={"warm_start": {"rows": len(rows)}},
                           keep_last=None)
    seconds = time.monotonic() - started
    first, last = (losses[0], losses[-1]) if losses else (None, None)
    log.info("warm start: %d rows, %d steps in %.0f s, loss %s -> %s", len(rows), len(losses), seconds, first, last)
    return FineTuned(checkpoint=path, steps=_steps(len(rows), cfg), seconds=seconds, first_loss=first,
                     last_loss=last)


def _steps(rows: int, cfg: RftConfig) -> int:
    return math.ceil(rows / cfg.batch_size) * cfg.epochs


def _sft(model: Any, hf_tok: Any, rows: Sequence[dict[str, list[int]]], cfg: RftConfig, seed: int,
         progress: Callable[[str], None] | None) -> tuple[Any, list[float]]:
    """TRL's SFTTrainer over the rows (in fp32 on the CPU, bf16 on CUDA); the model on the CPU again and each
    step's loss."""
    import datasets
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    steps, losses = _steps(len(rows), cfg), []

    class Progress(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None,
                   **kwargs: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))
                if progress is not None:
                    progress(f"warm start: step {state.global_step}/{steps}, loss {logs['loss']:.3f}")

    cuda = torch.cuda.is_available()
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # the run's own progress line says it (Progress above)
    try:
        with tempfile.TemporaryDirectory(prefix="litstream-rft-") as scratch:
            args = SFTConfig(output_dir=scratch, num_train_epochs=cfg.epochs, learning_rate=cfg.lr,
                             per_device_train_batch_size=cfg.batch_size, max_length=cfg.max_length,
                             completion_only_loss=True, gradient_checkpointing=False, bf16=cuda, use_cpu=not cuda,
                             logging_steps=1, save_strategy="no", report_to=[], seed=seed, disable_tqdm=True,
                             lr_scheduler_type="constant", dataloader_num_workers=0)
            trainer = SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(list(rows)),
                                 processing_class=hf_tok, callbacks=[Progress()])
            trainer.remove_callback(PrinterCallback)
            trainer.train()
    finally:
        if bars:
            datasets.enable_progress_bars()
    return trainer.model.to("cpu").float(), losses
