"""What answers a call: one seam (:class:`Backend`) over the project's inference engines.

* the torch engine on CPU (the tiny policy with a plain chat template, SmolLM2 with its tokenizer's template):
  concurrent calls are collected for a short window and sampled as one padded batch; weight swaps queue behind
  the batch in flight on the engine's single thread, so a swap never fails or alters a call already running;
* an OpenAI-compatible upstream (a vLLM server): prompts go as token ids to its ``/v1/completions``, asking for
  the sampled tokens' ids and log-probs (``return_token_ids``, ``logprobs``), through ``VllmEngine``. The upstream
  batches by itself; its weights are swapped by the trainer, so a switch here only records the version.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from litstream.trainer.constrained import ToolCallGrammar
from litstream.trainer.engines import Generation, InferenceEngine, TorchEngine, VllmEngine
from litstream.trainer.tokenizer import HFTokenizer, Tokenizer, load_tokenizer

from .openai_api import ApiError
from .tool_calls import ToolTemplate, Turn, generic_turns, native_messages, template_tools

PLAIN_ROLES = {"developer": "system", "function": "tool"}


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stops: tuple[str, ...] = ()
    grammar: ToolCallGrammar | None = None  # a forced tool call: every sequence is constrained to it

    @property
    def batch_key(self) -> tuple[float, float, ToolCallGrammar | None] | None:
        """Calls with the same key can share one batch (a constrained call only with calls of the same grammar);
        a seeded call is sampled alone (its seed is its own)."""
        return None if self.seed is not None else (self.temperature, self.top_p, self.grammar)


@dataclass
class Answer:
    """The generations of one call (one per choice) and the policy version that produced them."""

    generations: list[Generation]
    version: int


class Backend(Protocol):
    model_name: str

    @property
    def version(self) -> int: ...

    def chat_prompt(self, messages: Sequence[tuple[str, str]]) -> list[int]: ...

    @property
    def tool_template(self) -> ToolTemplate: ...

    def tool_chat_prompt(self, turns: Sequence[Turn], tools: list[dict[str, Any]]) -> list[int]: ...

    def text_prompt(self, prompt: str | list[int]) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special: bool = True) -> str: ...

    async def generate(self, prompt: list[int], n: int, sampling: Sampling) -> Answer: ...

    async def switch(self, version: int, checkpoint: str | None) -> None: ...

    def close(self) -> None: ...


def plain_chat_template(messages: Sequence[tuple[str, str]]) -> str:
    """The tiny policy's template: ``<|role|>`` lines, then the assistant's turn to speak."""
    turns = "".join(f"<|{PLAIN_ROLES.get(role, role)}|>\n{content}\n" for role, content in messages)
    return turns + "<|assistant|>\n"


def cut_at_stop(gen: Generation, stops: Sequence[str], tokenizer: Tokenizer) -> Generation:
    """End the generation at the first token that completes a stop sequence (its text excludes the stop, as
    OpenAI's does; its token ids keep what was sampled up to there, which is what the policy produced)."""
    if not stops:
        return gen
    for i in range(len(gen.token_ids)):
        text = tokenizer.decode(gen.token_ids[: i + 1])
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return Generation(prompt_token_ids=gen.prompt_token_ids, token_ids=gen.token_ids[: i + 1],
                              logprobs=gen.logprobs[: i + 1], text=text[: min(hits)], finish_reason="stop")
    return gen


def truncate(gen: Generation, max_new_tokens: int, tokenizer: Tokenizer) -> Generation:
    """A batch samples up to its longest call's limit: cut a generation back to its own call's limit."""
    if len(gen.token_ids) <= max_new_tokens:
        return gen
    ids = gen.token_ids[:max_new_tokens]
    return Generation(prompt_token_ids=gen.prompt_token_ids, token_ids=ids, logprobs=gen.logprobs[:max_new_tokens],
                      text=tokenizer.decode(ids), finish_reason="length")


@dataclass
class _Pending:
    prompts: list[list[int]]
    sampling: Sampling
    future: asyncio.Future[Answer]
    queued_at: float = field(default_factory=time.perf_counter)


class EngineBackend:
    """A backend over an ``InferenceEngine`` and its tokenizer.

    ``batch_window_s`` not None (the torch engine): calls are sampled in batches of up to ``max_batch``
    sequences. Calls that arrive while the engine samples wait and form the next batch; with a window > 0, each
    batch also waits that long after the engine became free (or after its first call arrived) for more calls.
    Every engine operation runs on one thread, in arrival order."""

    def __init__(self, engine: InferenceEngine, tokenizer: Tokenizer, model_name: str, *,
                 batch_window_s: float | None = None, max_batch: int = 32, threads: int = 1,
                 max_positions: int | None = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.batch_window_s = batch_window_s
        self.max_batch = max_batch
        self.max_positions = max_positions
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="policy-engine")
        self._queue: asyncio.Queue[_Pending] | None = None
        self._batcher: asyncio.Task[None] | None = None
        self._engine_free_at = 0.0
        self._recorded_version: int | None = None  # an upstream's version, as published
        self._tool_template: ToolTemplate | None = None
        self.stats = {"calls": 0, "batches": 0, "sequences": 0, "switches": 0}
        self.batch_sizes: deque[int] = deque(maxlen=10_000)  # the latest batches' sizes (benchmarks, tuning)

    @property
    def version(self) -> int:
        return self._recorded_version if self._recorded_version is not None else self.engine.version

    # -- prompts ------------------------------------------------------------------------------------------

    def chat_prompt(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        tok = self.tokenizer
        if isinstance(tok, HFTokenizer) and getattr(tok.tok, "chat_template", None):
            rendered = tok.tok.apply_chat_template([{"role": PLAIN_ROLES.get(r, r), "content": c}
                                                   for r, c in messages], add_generation_prompt=True, tokenize=True)
            ids = rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered
            return self._checked([int(i) for i in ids])
        return self._checked(tok.encode(plain_chat_template(messages)))

    @property
    def tool_template(self) -> ToolTemplate:
        """How this model's calls are rendered and parsed (``tool_calls.template_tools``)."""
        if self._tool_template is None:
            tok = self.tokenizer
            source = getattr(tok.tok, "chat_template", None) if isinstance(tok, HFTokenizer) else None
            self._tool_template = template_tools(source if isinstance(source, str) else None)
        return self._tool_template

    def tool_chat_prompt(self, turns: Sequence[Turn], tools: list[dict[str, Any]]) -> list[int]:
        """A conversation with tools or calls: the model's own template when it takes tools, else the generic
        template over its chat template (``tool_calls.generic_turns``)."""
        template = self.tool_template
        if not template.native:
            return self.chat_prompt(generic_turns(turns, tools, template.form))
        assert isinstance(self.tokenizer, HFTokenizer)
        from jinja2 import TemplateError

        try:
            rendered = self.tokenizer.tok.apply_chat_template(native_messages(turns), tools=tools or None,
                                                              add_generation_prompt=True, tokenize=True)
        except TemplateError as exc:
            raise ApiError(400, f"the model's chat template refused the messages: {exc}", param="messages",
                           code="invalid_value") from None
        ids = rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered
        return self._checked([int(i) for i in ids])

    def text_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self._checked(self.tokenizer.encode(prompt))
        bad = [i for i in prompt if not 0 <= i < self.tokenizer.vocab_size]
        if bad:
            raise ApiError(400, f"prompt token id {bad[0]} is outside the vocabulary (0..{self.tokenizer.vocab_size - 1})",
                           param="prompt", code="invalid_value")
        return self._checked(list(prompt))

    def _checked(self, ids: list[int]) -> list[int]:
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        return ids

    def decode(self, token_ids: Sequence[int], skip_special: bool = True) -> str:
        return self.tokenizer.decode(token_ids, skip_special=skip_special)

    def check_length(self, prompt: list[int], max_new_tokens: int) -> None:
        if self.max_positions is not None and len(prompt) + max_new_tokens > self.max_positions:
            raise ApiError(400, f"the prompt has {len(prompt)} tokens and max_tokens is {max_new_tokens}: together "
                                f"over this model's context of {self.max_positions} tokens; shorten the prompt or "
                                "lower max_tokens", param="max_tokens", code="context_length_exceeded")

    # -- sampling -----------------------------------------------------------------------------------------

    async def generate(self, prompt: list[int], n: int, sampling: Sampling) -> Answer:
        self.check_length(prompt, sampling.max_new_tokens)
        self.stats["calls"] += 1
        if self.batch_window_s is None or sampling.batch_key is None:
            gens, version = await self._run([prompt] * n, sampling)
            return Answer([self._finish(g, sampling) for g in gens], version)
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._batcher = asyncio.create_task(self._batch_loop(), name="policy-batcher")
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending([prompt] * n, sampling, fut))
        return await fut

    async def _run(self, prompts: list[list[int]], sampling: Sampling) -> tuple[list[Generation], int]:
        def work() -> tuple[list[Generation], int]:
            try:
                gens = self.engine.generate(prompts, sampling.max_new_tokens, temperature=sampling.temperature,
                                            top_p=sampling.top_p, seed=sampling.seed, grammar=sampling.grammar)
            except ValueError as exc:
                if sampling.grammar is None:
                    raise
                raise ApiError(400, f"the tools cannot be decoded under a grammar: {exc}", param="tools",
                               code="invalid_value") from None
            return gens, self.version  # read on the engine's thread: the version these weights are

        self.stats["batches"] += 1
        self.stats["sequences"] += len(prompts)
        self.batch_sizes.append(len(prompts))
        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    def _finish(self, gen: Generation, sampling: Sampling) -> Generation:
        return cut_at_stop(truncate(gen, sampling.max_new_tokens, self.tokenizer), sampling.stops, self.tokenizer)

    async def _batch_loop(self) -> None:
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            batch = [first]
            # The window opens when the engine is free: the callers the last batch just answered get that long
            # to come back and join this one (without it, a crowd of clients settles into alternating halves).
            deadline = max(first.queued_at, self._engine_free_at) + (self.batch_window_s or 0.0)
            size = len(first.prompts)
            while size < self.max_batch:
                left = deadline - time.perf_counter()
                if left <= 0 and self._queue.empty():
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), timeout=max(left, 0.0)) if left > 0 \
                        else self._queue.get_nowait()
                except (TimeoutError, asyncio.QueueEmpty):
                    break
                batch.append(item)
                size += len(item.prompts)
            # Awaited: calls arriving while the engine samples queue up and form the next batch.
            for group in _groups(batch):
                await self._run_group(group)
            self._engine_free_at = time.perf_counter()

    async def _run_group(self, group: list[_Pending]) -> None:
        prompts = [p for item in group for p in item.prompts]
        widest = max(item.sampling.max_new_tokens for item in group)
        base = group[0].sampling
        try:
            gens, version = await self._run(prompts, Sampling(widest, base.temperature, base.top_p,
                                                              grammar=base.grammar))
        except Exception as exc:  # every call of the batch gets the engine's error
            for item in group:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        at = 0
        for item in group:
            mine = gens[at: at + len(item.prompts)]
            at += len(item.prompts)
            if not item.future.done():
                item.future.set_result(Answer([self._finish(g, item.sampling) for g in mine], version))

    # -- versions -----------------------------------------------------------------------------------------

    async def switch(self, version: int, checkpoint: str | None) -> None:
        """Serve ``version`` from now on. Torch: load its weights on the engine thread, after the batches queued
        before it. An upstream: its weights were swapped by whoever published the version; record it."""
        if not isinstance(self.engine, TorchEngine):
            self._recorded_version = version
            self.stats["switches"] += 1
            return
        if checkpoint is None:
            raise ValueError(f"policy version {version} names no checkpoint: the torch engine cannot load it")
        await asyncio.get_running_loop().run_in_executor(self._pool, self.engine.apply_version, version, checkpoint)
        self.stats["switches"] += 1

    def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.engine.close()


def _groups(batch: list[_Pending]) -> list[list[_Pending]]:
    by_key: dict[Any, list[_Pending]] = {}
    for item in batch:
        by_key.setdefault(item.sampling.batch_key, []).append(item)
    return list(by_key.values())


# --- building one --------------------------------------------------------------------------------------------


def torch_backend(engine: TorchEngine, model_name: str, batch_window_s: float = 0.0,
                  max_batch: int = 32) -> EngineBackend:
    positions = getattr(getattr(engine.model, "config", None), "max_position_embeddings", None)
    return EngineBackend(engine, engine.tokenizer, model_name, batch_window_s=batch_window_s, max_batch=max_batch,
                         max_positions=int(positions) if positions else None)


def upstream_backend(base_url: str, upstream_model: str, tokenizer_dir: str | Path, model_name: str | None = None,
                     api_key: str | None = None, version: int = 0, threads: int = 16) -> EngineBackend:
    """Forward to an OpenAI-compatible server that takes token-id prompts and reports token ids and log-probs
    (vLLM). ``tokenizer_dir`` holds the served model's tokenizer (a checkpoint directory): the chat template is
    applied here so the recorded prompt token ids are exactly what the upstream was given."""
    engine = VllmEngine(base_url, upstream_model, api_key=api_key, version=version, max_parallel=threads)
    return EngineBackend(engine, load_tokenizer(tokenizer_dir), model_name or upstream_model, threads=threads)


def build_backend(*, checkpoint: str | Path | None = None, model: str | None = None, upstream: str | None = None,
                  upstream_model: str | None = None, tokenizer: str | Path | None = None,
                  upstream_api_key: str | None = None, name: str | None = None,
                  batch_window_s: float = 0.0, as_version: int | None = None) -> EngineBackend:
    """The backend the command line names: a checkpoint directory (served as the version it was saved as, or
    ``as_version``), a fresh ``tiny`` / ``smollm2`` policy, or an upstream URL (with its model name and a
    tokenizer directory)."""
    if upstream:
        if not (upstream_model and tokenizer):
            raise ValueError("--upstream needs --upstream-model (the name it serves) and --tokenizer (a directory "
                             "with the served model's tokenizer, e.g. its checkpoint)")
        return upstream_backend(upstream, upstream_model, tokenizer, model_name=name, api_key=upstream_api_key)
    if checkpoint:
        engine = TorchEngine.from_checkpoint(checkpoint, version=as_version)
        return torch_backend(engine, name or Path(checkpoint).name, batch_window_s=batch_window_s)
    kind = model or "tiny"
    if kind not in ("tiny", "smollm2"):
        raise ValueError(f"unknown model {kind!r}: tiny | smollm2 (or give --checkpoint DIR or --upstream URL)")
    from litstream.trainer.policy import build_policy

    policy = build_policy(kind)  # type: ignore[arg-type]
    return torch_backend(TorchEngine(policy.model, policy.tokenizer, 0), name or f"{kind}-policy",
                         batch_window_s=batch_window_s)
