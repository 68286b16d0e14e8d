"""The policy an agent calls, as its LLM resource names it: one inference engine per process, kept on the
published version.

A trained policy is published as an LLM resource with ``version`` and ``checkpoint`` (see
``trainer/service.py``). With a ``torch://`` endpoint the engine runs in this process and loads each new
version's weights itself, once, when the first attempt that names it arrives; with an ``http(s)://`` endpoint
(a vLLM server) the trainer has already swapped the server's weights and the engine only sends requests.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from litstream.schemas.models import LLM
from litstream.trainer.engines import Generation, InferenceEngine, TorchEngine, VllmEngine
from litstream.trainer.tokenizer import Tokenizer, load_tokenizer


@dataclass
class _Loaded:
    engine: InferenceEngine
    tokenizer: Tokenizer
    lock: threading.Lock  # the torch engine serves one generate or weight swap at a time


class PolicyEngines:
    """Engines by endpoint kind, shared by every agent slot of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: dict[str, _Loaded] = {}

    def _get(self, llm: LLM) -> _Loaded:
        key = "torch" if llm.endpoint.startswith("torch://") else llm.endpoint
        with self._lock:
            loaded = self._loaded.get(key)
            if loaded is None:
                loaded = self._load(llm)
                self._loaded[key] = loaded
        return loaded

    @staticmethod
    def _load(llm: LLM) -> _Loaded:
        checkpoint = llm.checkpoint or llm.endpoint.removeprefix("torch://")
        if llm.endpoint.startswith("torch://"):
            engine = TorchEngine.from_checkpoint(checkpoint)
            return _Loaded(engine, engine.tokenizer, threading.Lock())
        if not llm.checkpoint:
            raise ValueError(f"LLM resource {llm.model!r} at {llm.endpoint} names no checkpoint: the agent needs "
                             "its tokenizer to send token ids")
        return _Loaded(VllmEngine(llm.endpoint, llm.model, llm.api_key, version=llm.version or 0),
                       load_tokenizer(checkpoint), threading.Lock())

    def tokenizer(self, llm: LLM) -> Tokenizer:
        return self._get(llm).tokenizer

    def generate(self, llm: LLM, prompts: list[list[int]], **sampling: Any) -> tuple[list[Generation], int]:
        """Sample with the version ``llm`` names; returns the generations and the version that made them."""
        loaded = self._get(llm)
        with loaded.lock:
            engine = loaded.engine
            if isinstance(engine, TorchEngine) and llm.version is not None and engine.version != llm.version:
                engine.apply_version(llm.version, llm.checkpoint or llm.endpoint.removeprefix("torch://"))
            max_new_tokens = int(sampling.pop("max_tokens", sampling.pop("max_new_tokens", 16)))
            gens = engine.generate(prompts, max_new_tokens, **sampling)
            # A vLLM server's weights are the trainer's to swap: the version is the one published.
            return gens, engine.version if isinstance(engine, TorchEngine) else (llm.version or 0)


POLICIES = PolicyEngines()
