"""policy_server: what the OpenAI-compatible policy endpoint adds to a call, and what it serves under load.

* per call: the tiny policy on the torch engine (CPU), one prompt, greedy, ``max_tokens`` new tokens —
  ``TorchEngine.generate`` called directly, against the same call through ``POST /v1/completions`` (token-id
  prompt, a keep-alive HTTP connection, the span produced to an embedded broker before the answer). The overhead
  is the difference of the medians (and of the 90th percentiles);
* the same through ``POST /v1/chat/completions`` (chat template, messages in the span);
* the same completion under an attempt's path, with the lifecycle processor running: each call's sequence id is
  reserved through the rollout's partition while the policy samples (the reservation's round trip is shown);
* tokens/s with 1 and 16 concurrent clients (sampling at temperature 1), and for 16 clients once more with a
  5 ms batching window; the engine's own rate for one sequence and for a batch of 16 as the ceiling;
* the engine's rate for a forced tool call (``generate(grammar=...)``: constrained decoding through llguidance)
  beside plain sampling of the same prompt for the same number of steps, batch of 1 and of 16.

Calls other than the per-attempt ones go to plain ``/v1`` (recorded with no rollout).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from litstream.infra.settings import Settings
from litstream.trainer.constrained import ToolCallGrammar
from litstream.trainer.engines import TorchEngine
from litstream.trainer.policy import build_policy
from litstream.workers.policy_server.backends import EngineBackend, torch_backend
from litstream.workers.policy_server.process import RunningServer, ServerOptions

from .harness import Context, Report, Row
from .lifecycle import open_store, pipeline

TITLE = "policy server: overhead per call against the engine directly, tokens/s with 1 and 16 clients"


@dataclass(frozen=True)
class Sizes:
    calls: int  # timed calls per path
    max_tokens: int
    load_calls: int  # calls per client in the throughput runs
    load_tokens: int


FULL = Sizes(calls=200, max_tokens=16, load_calls=24, load_tokens=32)
QUICK = Sizes(calls=20, max_tokens=8, load_calls=4, load_tokens=16)


class _Served:
    """The server on its own event loop thread, as ``litstream policy-server`` runs it."""

    def __init__(self, settings: Settings, backend: EngineBackend) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.running = RunningServer(settings, backend, ServerOptions(port=0))
        asyncio.run_coroutine_threadsafe(self.running.start(), self.loop).result(60)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.running.stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)


def _post(conn: http.client.HTTPConnection, path: str, body: dict[str, Any]) -> dict[str, Any]:
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    if resp.status != 200:
        raise RuntimeError(f"{path}: HTTP {resp.status}: {data}")
    return data  # type: ignore[no-any-return]


def _latencies(fn: Any, n: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _p(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100)[int(q) - 1] if len(samples) > 1 else samples[0]


def _latency_row(what: str, samples: list[float], base: list[float] | None) -> Row:
    p50, p90 = statistics.median(samples) * 1e3, _p(samples, 90) * 1e3
    note = f"p50 {p50:.2f} ms, p90 {p90:.2f} ms"
    if base is not None:
        note += f"; engine alone p50 {statistics.median(base) * 1e3:.2f} ms"
    return Row(what, len(samples) / sum(samples), None, len(samples), note + " (calls/s)", samples)


def _load(port: int, clients: int, calls: int, max_tokens: int) -> tuple[float, int]:
    """(wall seconds, tokens generated) for ``clients`` threads each making ``calls`` chat calls."""
    body = {"model": "tiny-policy", "messages": [{"role": "user", "content": "Count: 1 2 3"}],
            "max_tokens": max_tokens, "temperature": 1.0}

    def client() -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            return sum(int(_post(conn, "/v1/chat/completions", body)["usage"]["completion_tokens"])
                       for _ in range(calls))
        finally:
            conn.close()

    with ThreadPoolExecutor(clients) as pool:
        t0 = time.perf_counter()
        tokens = sum(pool.map(lambda _: client(), range(clients)))
        return time.perf_counter() - t0, tokens


def _paired(direct: Any, served: Any, n: int) -> tuple[list[float], list[float]]:
    """Each served call right after a direct one, so both see the same load from the machine's neighbours."""
    direct(), served()  # warm-up
    a: list[float] = []
    b: list[float] = []
    for _ in range(n):
        for fn, out in ((direct, a), (served, b)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return a, b


class _EngineClock:
    """Times every ``generate`` of the served engine (the server calls it on one thread, one call at a time here),
    so each call's overhead is its client-side latency minus its own engine time: robust to the neighbours' load,
    which moves both by the same amount."""

    def __init__(self, engine: TorchEngine) -> None:
        self.samples: list[float] = []
        inner = engine.generate

        def generate(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.samples.append(time.perf_counter() - t0)

        engine.generate = generate  # type: ignore[method-assign]


def _overheads(clock: _EngineClock, served: list[float]) -> list[float]:
    engine_times = clock.samples[-len(served):]
    return [s - e for s, e in zip(served, engine_times)]


def _per_call(sizes: Sizes, engine: TorchEngine, clock: _EngineClock, port: int, prompt: list[int],
              chat_prompt: list[int]) -> tuple[list[Row], dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    completion = {"model": "tiny-policy", "prompt": prompt, "max_tokens": sizes.max_tokens, "temperature": 0}
    direct, served = _paired(lambda: engine.generate([prompt], sizes.max_tokens, temperature=0.0),
                             lambda: _post(conn, "/v1/completions", completion), sizes.calls)
    own = _overheads(clock, served)
    chat = {"model": "tiny-policy", "messages": [{"role": "user", "content": "Count: 1 2 3"}],
            "max_tokens": sizes.max_tokens, "temperature": 0}
    chat_direct, chatted = _paired(lambda: engine.generate([chat_prompt], sizes.max_tokens, temperature=0.0),
                                   lambda: _post(conn, "/v1/chat/completions", chat), sizes.calls)
    chat_own = _overheads(clock, chatted)
    conn.close()
    paired = [s - d for s, d in zip(served, direct)]
    figures = {"overhead_p50_ms": statistics.median(own) * 1e3, "overhead_p90_ms": _p(own, 90) * 1e3,
               "chat_overhead_p50_ms": statistics.median(chat_own) * 1e3,
               "chat_overhead_p90_ms": _p(chat_own, 90) * 1e3,
               "paired_difference_p50_ms": statistics.median(paired) * 1e3}
    rows = [_latency_row(f"engine.generate directly ({sizes.max_tokens} tokens)", direct, None),
            _latency_row("POST /v1/completions (token-id prompt)", served, direct),
            _latency_row("POST /v1/chat/completions", chatted, chat_direct),
            Row("overhead per call: latency - its engine time", None, None, len(own),
                f"completions p50 {figures['overhead_p50_ms']:.2f} ms, p90 {figures['overhead_p90_ms']:.2f} ms; "
                f"chat p50 {figures['chat_overhead_p50_ms']:.2f} ms, p90 {figures['chat_overhead_p90_ms']:.2f} ms"),
            Row("served - direct, paired calls", None, None, len(paired),
                f"p50 {figures['paired_difference_p50_ms']:.2f} ms (the neighbours' noise included)")]
    return rows, figures


async def _started_attempt(settings: Settings) -> tuple[str, str]:
    store = await open_store(settings)
    try:
        rollout = await store.start_rollout({"task": "policy_server bench"})
        return rollout.rollout_id, rollout.attempt.attempt_id
    finally:
        await store.close()


class _ReserveClock:
    """Times the recorder's sequence-id reservations (the lifecycle processor's round trip)."""

    def __init__(self, recorder: Any) -> None:
        self.samples: list[float] = []
        inner = recorder.reserve

        async def reserve(*args: Any, **kwargs: Any) -> int:
            t0 = time.perf_counter()
            try:
                return int(await inner(*args, **kwargs))
            finally:
                self.samples.append(time.perf_counter() - t0)

        recorder.reserve = reserve


def _per_attempt(sizes: Sizes, settings: Settings, clock: _EngineClock, server: _Served,
                 prompt: list[int]) -> tuple[list[Row], dict[str, Any]]:
    rid, aid = asyncio.run(_started_attempt(settings))
    reserves = _ReserveClock(server.running.recorder)
    conn = http.client.HTTPConnection("127.0.0.1", server.running.port, timeout=300)
    body = {"model": "tiny-policy", "prompt": prompt, "max_tokens": sizes.max_tokens, "temperature": 0}
    path = f"/rollout/{rid}/attempt/{aid}/v1/completions"
    served = _latencies(lambda: _post(conn, path, body), sizes.calls)
    conn.close()
    own = _overheads(clock, served)
    figures = {"attempt_overhead_p50_ms": statistics.median(own) * 1e3, "attempt_overhead_p90_ms": _p(own, 90) * 1e3,
               "reserve_p50_ms": statistics.median(reserves.samples) * 1e3}
    return [Row("overhead per call under /rollout/{rid}/attempt/{aid}", None, None, len(own),
                f"p50 {figures['attempt_overhead_p50_ms']:.2f} ms, p90 {figures['attempt_overhead_p90_ms']:.2f} ms; "
                f"its sequence-id reservation (run while sampling) p50 {figures['reserve_p50_ms']:.2f} ms")], figures


def _throughput(sizes: Sizes, engine: TorchEngine, backend: EngineBackend, port: int,
                prompt: list[int]) -> list[Row]:
    rows = []
    for batch in (1, 16):
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            gens = engine.generate([prompt] * batch, sizes.load_tokens, temperature=1.0)
            runs.append((time.perf_counter() - t0, sum(len(g.token_ids) for g in gens)))
        took, tokens = sorted(runs)[1]  # the median run
        rows.append(Row(f"engine alone, batch of {batch}", tokens / took, None, tokens,
                        "tokens/s (the ceiling; median of 3)", [r[0] for r in runs]))
    for clients, window in ((1, 0.0), (16, 0.0), (16, 0.005)):
        backend.batch_window_s = window
        backend.batch_sizes.clear()
        took, tokens = _load(port, clients, sizes.load_calls, sizes.load_tokens)
        batches = list(backend.batch_sizes)
        label = f"{clients} client{'s' if clients > 1 else ''}" + (f", {window * 1e3:.0f} ms window" if window else "")
        common = Counter(batches).most_common(2)
        rows.append(Row(f"server, {label}", tokens / took, None, tokens,
                        f"tokens/s; batches: mean {statistics.mean(batches):.1f}, largest {max(batches)}, most "
                        f"often {', '.join(str(size) for size, _ in common)}", [took]))
    backend.batch_window_s = 0.0
    return rows


# A forced call (tool_choice "required" or the function's name) of one tool, Hermes-framed. The strings are bounded:
# a random policy would otherwise rarely close one.
FORCED_CALL = ToolCallGrammar(
    tools=(("get_weather", json.dumps({
        "type": "object", "additionalProperties": False, "required": ["city", "unit"],
        "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]},
                       "days": {"type": "integer", "minimum": 1, "maximum": 7}}})),),
    begin="<tool_call>\n", end="\n</tool_call>")


def _timed_generate(engine: TorchEngine, prompts: list[list[int]], max_tokens: int, seed: int,
                    grammar: ToolCallGrammar | None) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds, tokens sampled, steps) of one generate at temperature 1."""
    t0, c0 = time.perf_counter(), time.process_time()
    gens = engine.generate(prompts, max_tokens, temperature=1.0, seed=seed, grammar=grammar)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, sum(len(g.token_ids) for g in gens), max(len(g.token_ids) for g in gens)


def forced_call_rows(engine: TorchEngine, prompt: list[int], repeats: int = 3) -> list[Row]:
    """The engine's tokens/s for a forced tool call against plain sampling of the same prompt, each plain run as
    many steps as the forced run before it (a batch's sequences end their calls at different steps: the steps/s
    ratio is the mask's own cost, the tokens/s ratio also counts the finished sequences' idle slots)."""
    rows = []
    for batch in (1, 16):
        prompts = [prompt] * batch
        engine.generate(prompts[:1], 4, grammar=FORCED_CALL)  # compiled once, outside the timing
        forced, plain = [], []
        for i in range(repeats):
            forced.append(_timed_generate(engine, prompts, 256, i, FORCED_CALL))
            plain.append(_timed_generate(engine, prompts, forced[-1][3], i, None))
        plain_rate = sum(r[2] for r in plain) / sum(r[0] for r in plain)
        forced_rate = sum(r[2] for r in forced) / sum(r[0] for r in forced)
        step_ratio = (sum(r[3] for r in forced) / sum(r[1] for r in forced)) / \
            (sum(r[3] for r in plain) / sum(r[1] for r in plain))
        rows.append(Row(f"engine alone, batch of {batch}, plain (as many steps as the forced call)", plain_rate,
                        None, sum(r[2] for r in plain), f"tokens/s over {repeats} runs", [r[0] for r in plain]))
        rows.append(Row(f"engine alone, batch of {batch}, forced tool call (constrained)", forced_rate, None,
                        sum(r[2] for r in forced), f"tokens/s over {repeats} runs, {forced_rate / plain_rate:.0%} "
                        f"of plain; steps per CPU-second {step_ratio:.0%} of plain's", [r[0] for r in forced]))
    return rows


def run(ctx: Context) -> Report:
    sizes = QUICK if ctx.quick else FULL
    load_before = os.getloadavg()[0]
    with pipeline(ctx, "policy_server") as settings:
        policy = build_policy("tiny", seed=0)
        engine = TorchEngine(policy.model, policy.tokenizer, 0)
        served_engine = TorchEngine(build_policy("tiny", seed=0).model, policy.tokenizer, 0)
        clock = _EngineClock(served_engine)
        backend = torch_backend(served_engine, "tiny-policy")
        prompt = backend.text_prompt("The policy says: ")
        ctx.step("starting the server on the embedded broker")
        server = _Served(settings, backend)
        try:
            ctx.step(f"{sizes.calls} calls each: engine directly, /v1/completions, /v1/chat/completions")
            chat_prompt = backend.chat_prompt([("user", "Count: 1 2 3")])
            rows, overhead = _per_call(sizes, engine, clock, server.running.port, prompt, chat_prompt)
            ctx.step(f"{sizes.calls} calls under an attempt's path (the lifecycle processor reserves sequence ids)")
            attempt_rows, attempt_figures = _per_attempt(sizes, settings, clock, server, prompt)
            rows += attempt_rows
            overhead.update(attempt_figures)
            ctx.step("throughput: 1 and 16 clients")
            rows += _throughput(sizes, engine, backend, server.running.port, prompt)
            ctx.step("a forced tool call against plain sampling, batch of 1 and 16")
            rows += forced_call_rows(engine, prompt, 1 if ctx.quick else 3)
        finally:
            server.stop()
    return Report(rows, {**asdict(sizes), **overhead, "model": "tiny (Llama, ~0.5M parameters, byte tokenizer)",
                         "spans_recorded": server.running.recorder.stats["spans"],
                         "load_average_1m": [load_before, os.getloadavg()[0]]})
