"""The policy an agent calls, as its LLM resource names it: one inference engine per process, kept on the
published version.

A trained policy is published as an LLM resource with ``version`` and ``checkpoint`` (see
``trainer/process.py``). With a ``torch://`` endpoint the engine runs in this process and loads each new
version's weights itself, once, when the first attempt that names it arrives; with an ``http(s)://`` endpoint
(a vLLM server) the trainer has already swapped the server's weights and the engine only sends requests.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from litstream.schemas.models import LLM
from litstream.trainer.engines import Generation, InferenceEngine, TorchEngine, VllmEngine
from litstream.trainer.tokenizer import Tokenizer, load_tokenizer

MAX_COMBINED = 64  # prompts sampled together at most, when concurrent agent slots call at once


@dataclass(eq=False)  # compared by identity: two calls can carry equal prompts
class _Call:
    """One agent slot's request, waiting to be sampled alone or with others of the same key."""

    prompts: list[list[int]]
    key: tuple[Any, ...]  # calls with equal keys can share one batch
    result: tuple[list[Generation], int] | None = None
    error: BaseException | None = None


@dataclass
class _Loaded:
    engine: InferenceEngine
    tokenizer: Tokenizer
    lock: threading.Lock  # the torch engine serves one generate or weight swap at a time
    queue: list[_Call] = field(default_factory=list)  # calls not yet taken by a batch
    queue_lock: threading.Lock = field(default_factory=threading.Lock)


class PolicyEngines:
    """Engines by endpoint kind, shared by every agent slot of the process.

    Concurrent calls are combined: each call queues itself, then waits for the engine; whichever call holds the
    engine samples every queued call with the same version and sampling as one batch and hands each its share.
    So N agent slots cost about one forward pass per token instead of N, with no thread of its own.
    """

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
        max_new_tokens = int(sampling.pop("max_tokens", sampling.pop("max_new_tokens", 16)))
        params = (max_new_tokens, tuple(sorted(sampling.items())))
        # A seeded call is sampled alone: its seed is its own. The version and checkpoint are part of the key,
        # since a batch runs on one set of weights.
        key = (llm.version, llm.checkpoint, llm.endpoint, params, id(prompts) if "seed" in sampling else None)
        call = _Call([list(p) for p in prompts], key)
        with loaded.queue_lock:
            loaded.queue.append(call)
        with loaded.lock:
            while call.result is None and call.error is None:  # nobody took it yet: lead a batch
                self._sample_batch(loaded, llm, call.key, max_new_tokens, sampling)
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    @staticmethod
    def _take_batch(loaded: _Loaded, key: tuple[Any, ...]) -> list[_Call]:
        with loaded.queue_lock:
            batch: list[_Call] = []
            size = 0
            for c in loaded.queue:
                if c.key == key and (not batch or size + len(c.prompts) <= MAX_COMBINED):
                    batch.append(c)
                    size += len(c.prompts)
            loaded.queue = [c for c in loaded.queue if c not in batch]
        return batch

    def _sample_batch(self, loaded: _Loaded, llm: LLM, key: tuple[Any, ...], max_new_tokens: int,
                      sampling: dict[str, Any]) -> None:
        """Under the engine lock: sample every queued call with ``key`` at once and give each its share."""
        batch = self._take_batch(loaded, key)
        try:
            engine = loaded.engine
            if isinstance(engine, TorchEngine) and llm.version is not None and engine.version != llm.version:
                engine.apply_version(llm.version, llm.checkpoint or llm.endpoint.removeprefix("torch://"))
            gens = engine.generate([p for c in batch for p in c.prompts], max_new_tokens, **sampling)
            # A vLLM server's weights are the trainer's to swap: the version is the one published.
            version = engine.version if isinstance(engine, TorchEngine) else (llm.version or 0)
        except BaseException as exc:  # every caller in the batch sees the failure, not only the leader
            for c in batch:
                c.error = exc
            return
        start = 0
        for c in batch:
            c.result = (gens[start:start + len(c.prompts)], version)
            start += len(c.prompts)


POLICIES = PolicyEngines()
