"""The runner's policy engines: concurrent agent slots share batches and each gets its own answer."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from litstream.schemas.models import LLM
from litstream.trainer.checkpoint import save_checkpoint
from litstream.trainer.engines import TorchEngine
from litstream.trainer.policy import build_policy
from litstream.workers.policy_engines import PolicyEngines


class CountingEngine(TorchEngine):
    """The real torch engine, counting the batches it samples (and able to fail on demand)."""

    batches: list[int]
    fail = False

    def generate(self, prompts: Any, max_new_tokens: int, **kw: Any) -> Any:
        self.batches.append(len(prompts))
        if self.fail:
            raise RuntimeError("engine broke")
        return super().generate(prompts, max_new_tokens, **kw)


def _engines(tmp_path: Path) -> tuple[PolicyEngines, LLM, CountingEngine]:
    p = build_policy("tiny", seed=0)
    ck = save_checkpoint(tmp_path, p.model, p.tokenizer, version=0)
    llm = LLM(endpoint=f"torch://{ck}", model="tiny", version=0, checkpoint=str(ck))
    engines = PolicyEngines()
    loaded = engines._get(llm)
    engine = CountingEngine(loaded.engine.model, loaded.tokenizer, 0)  # type: ignore[attr-defined]
    engine.batches = []
    loaded.engine = engine
    return engines, llm, engine


def _call_concurrently(engines: PolicyEngines, llm: LLM, prompts: list[list[int]]) -> list[Any]:
    results: list[Any] = [None] * len(prompts)
    start = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        start.wait()
        try:
            results[i] = engines.generate(llm, [prompts[i]], temperature=1.0, max_tokens=3)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_concurrent_calls_share_batches_and_get_their_own_answers(tmp_path: Path) -> None:
    engines, llm, engine = _engines(tmp_path)
    tok = engines.tokenizer(llm)
    prompts = [tok.encode(f"{'abcd'[i % 4]}x{i % 3 + 1}=") for i in range(16)]
    results = _call_concurrently(engines, llm, prompts)
    for prompt, (gens, version) in zip(prompts, results):
        assert len(gens) == 1 and gens[0].prompt_token_ids == prompt and version == 0
        assert 1 <= len(gens[0].token_ids) <= 3 and len(gens[0].logprobs) == len(gens[0].token_ids)
    assert sum(engine.batches) == 16
    assert len(engine.batches) < 16  # at least some calls were sampled together


def test_a_failing_batch_fails_every_call_in_it(tmp_path: Path) -> None:
    engines, llm, engine = _engines(tmp_path)
    engine.fail = True
    tok = engines.tokenizer(llm)
    results = _call_concurrently(engines, llm, [tok.encode("ax1=") for _ in range(6)])
    assert all(isinstance(r, RuntimeError) and "engine broke" in str(r) for r in results)


def test_greedy_calls_repeat_and_an_empty_prompt_is_refused(tmp_path: Path) -> None:
    engines, llm, engine = _engines(tmp_path)
    tok = engines.tokenizer(llm)
    gens, _ = engines.generate(llm, [tok.encode("ax1=")], temperature=0.0, max_tokens=2)
    again, _ = engines.generate(llm, [tok.encode("ax1=")], temperature=0.0, max_tokens=2)
    assert gens[0].token_ids == again[0].token_ids  # greedy twice: the same answer
    with pytest.raises(ValueError, match="empty prompt"):
        engines.generate(llm, [[]], temperature=1.0, max_tokens=2)
