"""Inference engines: torch generation (determinism, log-probs, eos, new versions), the vLLM client against a
stand-in server, choosing an engine from a resource; the real vLLM server only when it is installed."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from litstream.infra.settings import Settings
from litstream.schemas.events import NamedResourceRecord
from litstream.schemas.models import LLM
from litstream.trainer.checkpoint import save_checkpoint
from litstream.trainer.engines import (
    MIN_SHARED_PREFIX,
    InferenceEngine,
    TorchEngine,
    VllmEngine,
    common_prefix_length,
    engine_for_resource,
    parse_choice,
    start_vllm_server,
)
from litstream.trainer.grpo import pack, response_logprobs
from litstream.trainer.learner import GrpoLearner, LearnerConfig
from litstream.trainer.policy import build_policy
from litstream.trainer.windows import Sample
from litstream.workers.policy_server.backends import upstream_backend
from tests.policy_server_helpers import ServerThread
from tests.test_policy_server_tools import (
    ASK,
    TOOLS,
    call_spans,
    client,
    plan,
    tiny_tools_engine,
    valid_calls,
)

torch.set_num_threads(1)
PROMPTS = [[257, 97, 120, 50, 61], [257, 98, 61], [257, 99, 120, 51, 61, 32, 32]]


def test_generation_is_deterministic_under_a_seed() -> None:
    p = build_policy("tiny", seed=0)
    eng = TorchEngine(p.model, p.tokenizer)
    assert isinstance(eng, InferenceEngine)
    a = eng.generate(PROMPTS, max_new_tokens=8, seed=11)
    b = eng.generate(PROMPTS, max_new_tokens=8, seed=11)
    c = eng.generate(PROMPTS, max_new_tokens=8, seed=12)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]
    for g, prompt in zip(a, PROMPTS):
        assert g.prompt_token_ids == prompt and len(g.logprobs) == len(g.token_ids) <= 8
        assert g.text == p.tokenizer.decode(g.token_ids)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_equal_a_forward_pass(temperature: float, top_p: float) -> None:
    """Reported log-probs are those at the sampling temperature, which the learner recomputes, with left padding
    at generation and right padding at training."""
    p = build_policy("tiny", seed=0)
    gens = TorchEngine(p.model, p.tokenizer).generate(PROMPTS, 6, temperature=temperature, top_p=top_p, seed=3)
    batch = pack([g.prompt_token_ids for g in gens], [g.token_ids for g in gens], p.tokenizer.pad_id)
    with torch.no_grad():
        logp, _ = response_logprobs(p.model, batch, temperature=temperature)
    for b, g in enumerate(gens):
        assert logp[b, : len(g.token_ids)].tolist() == pytest.approx(g.logprobs, abs=1e-4)


def test_the_prompt_pass_computes_the_last_positions_logits_only_and_samples_the_same() -> None:
    p = build_policy("tiny", seed=0)
    eng = TorchEngine(p.model, p.tokenizer)
    assert eng._last_logits == {"logits_to_keep": 1}
    a = eng.generate(PROMPTS, 6, temperature=0.7, seed=3)
    eng._last_logits = {}  # every position's logits, as a model without logits_to_keep
    b = eng.generate(PROMPTS, 6, temperature=0.7, seed=3)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.logprobs for g in a] == [pytest.approx(g.logprobs, abs=1e-6) for g in b]


def test_a_prefix_every_prompt_shares_is_computed_once_and_samples_the_same() -> None:
    """An agent's calls share their system prompt and tool definitions: the prefix's pass runs once and its cache is
    repeated; each row then scores and samples (greedy) as it would alone, and its log-probs are the learner's."""
    p = build_policy("tiny", seed=0)
    tok = p.tokenizer
    head = "You are a careful assistant. Answer with the copy only. "
    prompts = [tok.encode(head + tail) for tail in ("ax2=", "bx3=", "a much longer question, cx1=", "dx2=")]
    assert common_prefix_length(prompts) >= MIN_SHARED_PREFIX
    eng = TorchEngine(p.model, tok)
    together = eng.generate(prompts, 8, temperature=0.0)
    alone = [eng.generate([q], 8, temperature=0.0)[0] for q in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    for g, a in zip(together, alone):
        assert g.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    sampled = eng.generate(prompts + prompts, 6, temperature=0.8, seed=2)  # n choices of one prompt, too
    batch = pack([g.prompt_token_ids for g in sampled], [g.token_ids for g in sampled], tok.pad_id)
    with torch.no_grad():
        logp, _ = response_logprobs(p.model, batch, temperature=0.8)
    for b, g in enumerate(sampled):
        assert logp[b, : len(g.token_ids)].tolist() == pytest.approx(g.logprobs, abs=1e-4)


def test_generation_stops_at_eos() -> None:
    p = build_policy("tiny", seed=0)
    eos = p.tokenizer.eos_id
    # Teach the model to answer "a" then eos, a few supervised steps.
    opt = torch.optim.AdamW(p.model.parameters(), lr=1e-2)
    prompts = [[257, 97 + i % 3, 61] for i in range(12)]
    batch = pack(prompts, [[97, eos]] * len(prompts), p.tokenizer.pad_id)
    for _ in range(40):
        logp, _ = response_logprobs(p.model, batch)
        loss = -(logp.sum() / batch.response_mask.sum())
        opt.zero_grad()
        loss.backward()
        opt.step()
    gens = TorchEngine(p.model, p.tokenizer).generate(prompts[:3], 5, temperature=0.0)
    for g in gens:
        assert g.token_ids == [97, eos] and g.finish_reason == "stop" and g.text == "a"
    long = TorchEngine(p.model, p.tokenizer).generate(prompts[:1], 1, temperature=0.0)
    assert long[0].token_ids == [97] and long[0].finish_reason == "length"


def test_apply_version_changes_outputs(tmp_path: Path) -> None:
    p = build_policy("tiny", seed=0)
    v0 = save_checkpoint(tmp_path, p.model, p.tokenizer, version=0)
    eng = TorchEngine.from_checkpoint(v0)
    before = eng.generate(PROMPTS, 6, seed=5)
    learner = GrpoLearner(p.model, p.tokenizer, LearnerConfig(lr=5e-2))
    group = [Sample(f"r{i}", "a", 0, "g", 0, tuple(g.prompt_token_ids), tuple(g.token_ids), tuple(g.logprobs),
                    float(i)) for i, g in enumerate(before)]
    learner.step([[*group]])
    v1 = learner.save(tmp_path)
    seconds = eng.apply_version(learner.version, v1)
    assert eng.version == 1 and seconds >= 0
    after = eng.generate(PROMPTS, 6, seed=5)
    assert [g.logprobs for g in after] != [g.logprobs for g in before]
    # the engine now serves exactly the learner's weights
    fresh = TorchEngine(learner.model, p.tokenizer).generate(PROMPTS, 6, seed=5)
    assert [g.token_ids for g in fresh] == [g.token_ids for g in after]


def test_parse_choice_both_token_formats() -> None:
    choice = {"index": 0, "text": "ab", "finish_reason": "stop",
              "logprobs": {"tokens": ["token_id:97", "token_id:98", "token_id:258"],
                           "token_logprobs": [-0.1, -0.2, -0.3]}}
    g = parse_choice(choice, [257, 97])
    assert g.token_ids == [97, 98, 258] and g.logprobs == [-0.1, -0.2, -0.3] and g.finish_reason == "stop"
    g2 = parse_choice({**choice, "token_ids": [1, 2, 3], "finish_reason": "length"}, [257])
    assert g2.token_ids == [1, 2, 3] and g2.finish_reason == "length"
    with pytest.raises(RuntimeError, match="log-probs"):
        parse_choice({"index": 0, "token_ids": [1, 2], "logprobs": None}, [257])


class _StandIn(BaseHTTPRequestHandler):
    calls: ClassVar[list[tuple[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        type(self).calls.append((self.path, body))
        out: Any = {}
        if self.path == "/v1/completions":
            out = {"choices": [
                {"index": i, "text": "x", "finish_reason": "length",
                 "logprobs": {"tokens": [f"token_id:{120 + i}"], "token_logprobs": [-1.5]}}
                for i in range(len(body["prompt"]))]}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[str]:
    _StandIn.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_vllm_engine_requests_and_hot_swap_sequence(stand_in: str, tmp_path: Path) -> None:
    eng = VllmEngine(stand_in, "policy", api_key="k")
    gens = eng.generate([[257, 97], [257, 98]], 4, temperature=0.8)
    assert [g.token_ids for g in gens] == [[120], [121]] and gens[1].prompt_token_ids == [257, 98]
    path, body = _StandIn.calls[0]
    assert path == "/v1/completions" and body["prompt"] == [[257, 97], [257, 98]]
    assert body["return_tokens_as_token_ids"] is True and body["logprobs"] >= 0 and body["max_tokens"] == 4
    _StandIn.calls.clear()
    eng.generate([[257, 97]] * 3, 4, seed=10)  # seeded: one request per prompt, distinct seeds
    assert sorted(b["seed"] for _, b in _StandIn.calls) == [10, 11, 12]
    _StandIn.calls.clear()
    (tmp_path / "model.safetensors").write_bytes(b"")
    eng.apply_version(3, tmp_path)
    assert [c[0] for c in _StandIn.calls] == ["/pause?mode=wait", "/collective_rpc", "/reset_prefix_cache",
                                              "/update_weight_version", "/resume"]
    assert _StandIn.calls[1][1] == {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path.resolve())}}
    assert _StandIn.calls[3][1] == {"new_version": "3"} and eng.version == 3
    _StandIn.calls.clear()
    with pytest.raises(FileNotFoundError):  # a failed reload would kill a real server's engine: checked first
        eng.apply_version(4, tmp_path / "missing")
    assert _StandIn.calls == [] and eng.version == 3


def test_engine_for_resource(tmp_path: Path) -> None:
    p = build_policy("tiny", seed=0)
    save_checkpoint(tmp_path, p.model, p.tokenizer, version=4)
    torch_eng = engine_for_resource(LLM(endpoint=f"torch://{tmp_path}", model="tiny"))
    assert isinstance(torch_eng, TorchEngine) and torch_eng.version == 4
    http = engine_for_resource(NamedResourceRecord(resource_type="llm", endpoint="http://h:8000/v1", model="m"))
    assert isinstance(http, VllmEngine) and http.root == "http://h:8000" and http.model == "m"
    explicit = engine_for_resource({"endpoint": "http://h:8000/v1", "model": "m", "engine": "vllm"})
    assert isinstance(explicit, VllmEngine)
    with pytest.raises(ValueError):
        engine_for_resource({"endpoint": "ftp://x", "model": "m"})


def _vllm_python() -> str | None:
    """A Python with vLLM: LITSTREAM_VLLM_PYTHON, or this one if it imports vllm."""
    explicit = os.environ.get("LITSTREAM_VLLM_PYTHON")
    if explicit:
        return explicit
    return "python" if importlib.util.find_spec("vllm") is not None else None


@pytest.mark.slow(enabled_by="LITSTREAM_VLLM_PYTHON", if_importable="vllm")
@pytest.mark.skipif(_vllm_python() is None, reason="vLLM is not installed (set LITSTREAM_VLLM_PYTHON)")
@pytest.mark.timeout(600)
def test_real_vllm_matches_torch_and_hot_swaps(tmp_path: Path) -> None:
    """A real vLLM server on the same checkpoint reports the torch forward pass's log-probs; a hot swap to a new
    version serves the learner's new weights (log-probs match them again) and reports the version."""
    import sys
    import time
    from concurrent.futures import ThreadPoolExecutor

    python = _vllm_python()
    # head_dim 32 (96 / 3): vLLM's CPU attention takes head sizes 32, 64, 80, 96, ..., not the default 24.
    p = build_policy("tiny", seed=0, heads=3)
    v0 = save_checkpoint(tmp_path / "ck", p.model, p.tokenizer, version=0)

    def max_diff(model: Any, gens: list[Any], temperature: float = 1.0) -> float:
        batch = pack([g.prompt_token_ids for g in gens], [g.token_ids for g in gens], p.tokenizer.pad_id)
        with torch.no_grad():
            logp, _ = response_logprobs(model, batch, temperature=temperature)
        return max(abs(a - b) for i, g in enumerate(gens)
                   for a, b in zip(logp[i, : len(g.token_ids)].tolist(), g.logprobs, strict=True))

    with start_vllm_server(v0, python=sys.executable if python == "python" else python,
                           log_path=tmp_path / "vllm.log", max_model_len=256) as server:
        eng = server.engine()
        assert eng.version == 0 and eng.weight_info() == {"weight_version": "0"}
        gens = eng.generate(PROMPTS, 6, seed=1)
        assert [g.prompt_token_ids for g in gens] == PROMPTS
        assert all(1 <= len(g.token_ids) == len(g.logprobs) <= 6 for g in gens)
        assert all(g.finish_reason in ("stop", "length") for g in gens)
        assert [g.token_ids for g in eng.generate(PROMPTS, 6, seed=1)] == [g.token_ids for g in gens]
        unseeded = eng.generate(PROMPTS, 6, temperature=0.7)  # one batched request
        assert [len(g.token_ids) for g in unseeded] and [g.prompt_token_ids for g in unseeded] == PROMPTS
        diff0 = max(max_diff(p.model, gens), max_diff(p.model, unseeded, 0.7))  # log-probs at the temperature
        assert diff0 < 1e-4

        learner = GrpoLearner(p.model, p.tokenizer, LearnerConfig(lr=5e-2))
        learner.step([[Sample(f"r{i}", "a", 0, "g", 0, tuple(g.prompt_token_ids), tuple(g.token_ids),
                              tuple(g.logprobs), float(i)) for i, g in enumerate(gens)]])
        v1 = learner.save(tmp_path / "ck")
        reload_s = eng.apply_version(1, v1)
        assert eng.version == 1 and eng.weight_info() == {"weight_version": "1"}
        after = eng.generate(PROMPTS, 6, seed=1)
        assert [g.logprobs for g in after] != [g.logprobs for g in gens]
        diff1 = max_diff(learner.model, after)
        assert diff1 < 1e-4

        # A swap while generations are in flight (pause_mode "wait"): they finish on the old weights, none is
        # cut short ("abort" is what pause_mode="abort" would give them).
        in_flight = ThreadPoolExecutor(1).submit(eng.generate, [PROMPTS[0]] * 16, 240)
        time.sleep(0.3)
        eng.apply_version(2, v1)  # the same weights under a new version number
        for g in in_flight.result(timeout=300):
            assert g.finish_reason == "stop" or (g.finish_reason == "length" and len(g.token_ids) == 240)
        assert eng.weight_info() == {"weight_version": "2"}
        via_resource = engine_for_resource(LLM(endpoint=server.base_url, model=server.model), version=2)
        assert isinstance(via_resource, VllmEngine)
        assert via_resource.generate(PROMPTS, 4, seed=3)[0].token_ids == eng.generate(PROMPTS, 4, seed=3)[0].token_ids
        print(f"\nvLLM server start {server.start_seconds:.1f} s, reload {reload_s * 1000:.0f} ms, "
              f"max |logprob diff| v0 {diff0:.2e}, v1 {diff1:.2e}")


@pytest.mark.slow(enabled_by="LITSTREAM_VLLM_PYTHON", if_importable="vllm")
@pytest.mark.skipif(_vllm_python() is None, reason="vLLM is not installed (set LITSTREAM_VLLM_PYTHON)")
@pytest.mark.timeout(900)
def test_real_vllm_upstream_decodes_forced_tool_calls(settings: Settings, tmp_path: Path) -> None:
    """The policy endpoint in front of a real vLLM server: forced tool calls (a named function, and required) go
    to vLLM as its guidance backend's grammar; the calls validate against their schemas, and the span records
    the tokens vLLM sampled (the same request sent to vLLM directly, with the same seed, samples them again)."""
    import sys

    python = _vllm_python()
    tiny = tiny_tools_engine()  # 2048 positions: the generic tool preamble is long
    v0 = save_checkpoint(tmp_path / "ck", tiny.model, tiny.tokenizer, version=0)
    forced: dict[str, Any] = {"get_weather": {"type": "function", "function": {"name": "get_weather"}},
                              "required": "required"}
    with start_vllm_server(v0, python=sys.executable if python == "python" else python,
                           log_path=tmp_path / "vllm.log", max_model_len=2048, ready_timeout=600) as vllm:
        front = upstream_backend(vllm.base_url, vllm.model, v0, model_name="front")
        with ServerThread(settings, front) as server:
            answers = {key: client(server).chat.completions.create(
                model="front", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=400, seed=seed,
                logprobs=True, extra_body={"return_token_ids": True})
                for seed, (key, choice) in enumerate(forced.items(), start=7)}
            recorded = call_spans(settings, 2)
        for key, answer in answers.items():
            [choice] = answer.choices
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            calls = valid_calls(choice.message.tool_calls)
            assert calls and (key == "required" or [name for name, _ in calls] == [key])
            span = recorded[answer.id]
            assert span["litstream.constrained"] is True and span["litstream.tool_calls.count"] == len(calls)
            assert choice.model_extra and span["response_token_ids"] == choice.model_extra["token_ids"]
            assert span["response_token_ids"][-1] == tiny.tokenizer.eos_id
            grammar = plan(ASK, tools=TOOLS, tool_choice=forced[key]).grammar(front.tool_template.form)
            [again] = vllm.engine().generate(
                [span["prompt_token_ids"]], span["gen_ai.request.max_tokens"], span["gen_ai.request.temperature"],
                span["gen_ai.request.top_p"], seed=span["gen_ai.request.seed"], grammar=grammar)
            assert again.token_ids == span["response_token_ids"]
            assert again.logprobs == pytest.approx(span["response_logprobs"], abs=1e-6)
    print(f"\nvLLM server start {vllm.start_seconds:.1f} s")


def test_a_checkpoint_is_served_at_its_version_or_the_one_named(tmp_path: Path) -> None:
    """An earlier run's checkpoint (version 3 in its trainer_state.json) served for a new run is that run's
    version 0: ``litstream train --algorithm baseline --model <that directory>`` serves it ``--as-version 0``."""
    from litstream.workers.policy_server.backends import build_backend

    p = build_policy("tiny", seed=0)
    v3 = save_checkpoint(tmp_path, p.model, p.tokenizer, version=3)
    assert TorchEngine.from_checkpoint(v3).version == 3
    assert TorchEngine.from_checkpoint(v3, version=0).version == 0
    assert build_backend(checkpoint=v3, as_version=0).engine.version == 0
