"""What a call samples with when it names no ``temperature``, ``top_p`` or ``max_tokens``: the served policy's own
defaults, as vLLM applies a model's ``generation_config``.

Where they come from, latest first:

1. the sampling parameters published with the policy version being served (the trainer publishes its
   ``temperature`` and ``max_tokens`` with every ``policy-vN``; the learner scores each sample at what it was drawn
   with, so an agent that names nothing trains at the policy's own temperature);
2. before any publication, the model's defaults: ``tiny`` and ``smollm2`` those of ``trainer/defaults.py``, a
   checkpoint or tokenizer directory its ``generation_config.json``;
3. otherwise OpenAI's: temperature 1, top_p 1, and the server's ``default_max_tokens``.

A request that names a parameter is always honoured; ``/v1/models`` shows the defaults in force and every span
records what the call used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

OPENAI_SOURCE = "OpenAI's defaults"


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None  # None: the server's default_max_tokens
    source: str = OPENAI_SOURCE  # where they came from, for /v1/models and the docs

    def merged(self, params: Mapping[str, Any], source: str) -> SamplingDefaults:
        """These defaults with what ``params`` (a publication's ``sampling_parameters``, a generation config)
        sets; values out of OpenAI's ranges are left out."""
        out = self
        temperature = _number(params.get("temperature"), 0.0, 2.0)
        if temperature is not None:
            out = replace(out, temperature=temperature)
        top_p = _number(params.get("top_p"), 0.0, 1.0)
        if top_p is not None and top_p > 0:
            out = replace(out, top_p=top_p)
        max_tokens = params.get("max_tokens", params.get("max_new_tokens"))
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1:
            out = replace(out, max_tokens=max_tokens)
        return out if out == self else replace(out, source=source)

    def as_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens,
                "source": self.source}


def _number(value: Any, low: float, high: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) and low <= v <= high else None


def model_defaults(kind: str) -> SamplingDefaults:
    """The defaults of a fresh ``tiny`` or ``smollm2`` policy (what the trainer publishes for it)."""
    from litstream.trainer.defaults import defaults_for

    d = defaults_for(kind)
    return SamplingDefaults().merged({"temperature": d.temperature, "max_tokens": d.max_tokens},
                                     f"the {kind} policy's defaults")


def generation_config_defaults(directory: str | Path | None) -> SamplingDefaults:
    """The sampling defaults a model directory's ``generation_config.json`` names (none when it has none, or
    when it decodes greedily by default: ``do_sample`` false names no temperature to sample at)."""
    if directory is None:
        return SamplingDefaults()
    path = Path(directory) / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return SamplingDefaults()
    if not isinstance(config, dict) or config.get("do_sample") is False:
        return SamplingDefaults()
    params = {k: config[k] for k in ("temperature", "top_p", "max_new_tokens") if k in config}
    return SamplingDefaults().merged(params, f"{path}")


def initial_defaults(model: str | None = None, checkpoint: str | Path | None = None,
                     tokenizer: str | Path | None = None) -> SamplingDefaults:
    """The defaults before any publication, for what ``build_backend`` serves: a checkpoint's (or an upstream's
    tokenizer directory's) generation config, else a fresh policy's own."""
    if checkpoint is not None or tokenizer is not None:
        return generation_config_defaults(checkpoint if checkpoint is not None else tokenizer)
    return model_defaults(model or "tiny")
