"""Checkpoints: ``<root>/v{N}/`` with the weights (safetensors, untied), the model config, the tokenizer, the
optimizer state, ``trainer_state.json`` (version, step) and, from a learner, ``generation_config.json`` (the
temperature the version was sampled at while it trained).

A checkpoint directory is also what an inference engine loads: transformers' ``from_pretrained`` and vLLM's
``reload_weights`` read it as is. It is written into a temporary sibling and renamed into place, so a reader
never sees half a checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .tokenizer import Tokenizer, load_tokenizer

WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.pt"
STATE = "trainer_state.json"
GENERATION = "generation_config.json"  # Hugging Face's name: servers read their sampling defaults from it
_DIR = re.compile(r"^v(\d+)$")


@dataclass
class Checkpoint:
    path: Path
    model: Any
    tokenizer: Tokenizer
    version: int
    step: int
    optimizer_state: dict[str, Any] | None
    extra: dict[str, Any] = field(default_factory=dict)


def checkpoint_path(root: str | Path, version: int) -> Path:
    return Path(root) / f"v{version}"


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _DIR.match(p.name)
        if m and (p / STATE).exists():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def save_checkpoint(root: str | Path, model: Any, tokenizer: Tokenizer, version: int, step: int = 0,
                    optimizer: torch.optim.Optimizer | None = None, extra: dict[str, Any] | None = None,
                    keep_last: int | None = 3, keep_every: int | None = None,
                    temperature: float | None = None) -> Path:
    """``temperature``: what the version was sampled at while it trained, written as its generation config so that
    serving the checkpoint on its own (``--model <dir>``, vLLM) samples as the run did."""
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(root, version)
    tmp = root / f".tmp-v{version}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        _check_untied(model, state)
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        model.config.tie_word_embeddings = False
        model.config.save_pretrained(str(tmp))
        tokenizer.save(tmp)
        if temperature is not None:
            generation = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
            (tmp / GENERATION).write_text(json.dumps(generation))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / OPTIMIZER)
        meta = {"version": version, "step": step, "time": time.time(), "extra": extra or {}}
        (tmp / STATE).write_text(json.dumps(meta))
        _fsync_dir_files(tmp)
        if final.exists():  # re-saving a version: move the old one aside first (rename cannot replace a dir)
            old = root / f".old-v{version}-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last is not None:
        prune(root, keep_last, keep_every)
    return final


def prune(root: str | Path, keep_last: int, keep_every: int | None = None) -> list[Path]:
    """Removes all but the newest ``keep_last`` checkpoints, except that versions divisible by ``keep_every``
    (the ones validation reads) keep their weights (their optimizer state goes); returns what it removed."""
    found = list_checkpoints(root)
    doomed = [(v, p) for v, p in found[: max(0, len(found) - max(1, keep_last))]]
    removed = []
    for v, p in doomed:
        if keep_every and v % keep_every == 0:
            (p / OPTIMIZER).unlink(missing_ok=True)
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """``trainer_state.json`` of one checkpoint: version, step, time, extra."""
    return dict(json.loads((Path(path) / STATE).read_text()))


def checkpoint_extra(path: str | Path) -> dict[str, Any]:
    """What the saver passed as ``extra`` (e.g. the service's consumer positions and window buffer)."""
    return dict(checkpoint_meta(path).get("extra") or {})


def load_checkpoint(path: str | Path, with_optimizer: bool = True) -> Checkpoint:
    """Loads ``path`` (one ``v{N}`` directory, or a root: then its latest checkpoint; or a Hugging Face model
    directory, as version 0)."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    meta: dict[str, Any] = {"version": 0, "step": 0}
    if (path / STATE).exists():
        meta = json.loads((path / STATE).read_text())
    elif (latest := latest_checkpoint(path)) is not None:
        path = latest
        meta = json.loads((path / STATE).read_text())
    elif not (path / "config.json").exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    opt_state = None
    if with_optimizer and (path / OPTIMIZER).exists():
        opt_state = torch.load(path / OPTIMIZER, map_location="cpu", weights_only=True)
    return Checkpoint(path=path, model=model, tokenizer=load_tokenizer(path), version=int(meta["version"]),
                      step=int(meta["step"]), optimizer_state=opt_state, extra=meta.get("extra", {}))


def load_weights_into(model: Any, path: str | Path) -> None:
    """Overwrites ``model``'s weights in place from a checkpoint directory (same architecture)."""
    from safetensors.torch import load_file

    state = load_file(str(Path(path) / WEIGHTS))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.endswith("inv_freq")]:
        raise ValueError(f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}")


def _check_untied(model: Any, state: dict[str, torch.Tensor]) -> None:
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    if out is not None and out.weight.data_ptr() == inp.weight.data_ptr():
        raise ValueError("tied input/output embeddings: untie them first (policy.untie)")
    if out is not None and "lm_head.weight" not in state:
        raise ValueError("the state dict has no explicit lm_head.weight")


def _fsync_dir_files(directory: Path) -> None:
    for p in directory.iterdir():
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
