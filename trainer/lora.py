"""LoRA: low-rank adapters trained in place of the model's own weights, through ``peft``.

``with_lora`` wraps a Hugging Face causal LM with adapters of one rank on every linear layer of its blocks (peft's
``all-linear``: the attention and MLP projections, not the output layer); only the adapters train. Dropout is off,
so the learner's log-probs of a sample are a function of the weights alone, as GRPO's ratio needs.

A checkpoint holds what an engine serves: the adapters merged into a copy of the base weights (``servable``), so
the policy server, vLLM and a resumed run read plain weights whatever trained them. A run resumed from such a
checkpoint starts fresh adapters (zero at the start) on the merged weights: the policy goes on unchanged, the
optimizer's moments start afresh.
"""

from __future__ import annotations

import copy
from typing import Any


def with_lora(model: Any, rank: int, alpha: int | None = None) -> Any:
    """``model`` with rank-``rank`` adapters on each linear layer of its blocks, scaled ``alpha / rank`` (default
    alpha: twice the rank); every other parameter is frozen."""
    from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise ValueError(f"the LoRA rank must be at least 1, not {rank}")
    config = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else 2 * rank, lora_dropout=0.0,
                        target_modules="all-linear", bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def has_lora(model: Any) -> bool:
    return callable(getattr(model, "merge_and_unload", None)) and hasattr(model, "peft_config")


def base_model(model: Any) -> Any:
    """The Hugging Face model under the adapters (``model`` itself without them)."""
    return model.get_base_model() if has_lora(model) else model


def servable(model: Any) -> Any:
    """The model a checkpoint holds: with adapters, a copy with them merged into its weights; else ``model``."""
    if not has_lora(model):
        return model
    return copy.deepcopy(model).merge_and_unload()
