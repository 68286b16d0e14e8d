"""The span sink and the triplet processor alone, each draining one backlog: records/s and CPU-seconds.

``--rollouts`` finished attempts are written before either consumer starts: per rollout the spans an agent writes
(the rollout span, one LLM call with token ids, a verify span and a reward) on ``spans`` and a snapshot that ends
the attempt on ``rollout-state``. Then, one after the other, in this process:

* the span sink drains ``spans`` into a fresh chDB; the clock stops when every span's insert has finished;
* the triplet processor drains ``spans`` and ``rollout-state``; the clock stops when every attempt is finalized
  (its triplet handed to the producer).

CPU-seconds are this process's (the consumer, its inserter and the clients' threads), those of the thread that
runs the consumer's loop alone, and the embedded broker's (from /proc). On a busy machine the loop thread's figure
is the one to compare: other processes' load stretches the wall clock, not a thread's CPU time.

    python -m bench.consume_drain [--rollouts 5000] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.events import AttemptSnapshot, RolloutSnapshot
from litstream.streams.span_sink import SpanSink
from litstream.streams.triplet_buffer import Limits
from litstream.streams.triplet_processor import TripletProcessor
from litstream.workers.sdk import AttemptContext

from .lifecycle import embedded_broker
from .lifecycle_drain import _Steps
from .processes import cpu_of

SPANS_PER_ROLLOUT = 4
LLM_ATTRS: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "toy",
                             "prompt_token_ids": [11, 12, 13], "response_token_ids": [21, 22],
                             "response_logprobs": [-0.5, -0.25], "gen_ai.prompt.0.role": "user",
                             "gen_ai.prompt.0.content": "2+2?", "gen_ai.completion.0.role": "assistant",
                             "gen_ai.completion.0.content": "4"}


class Draining(Protocol):
    stop_event: threading.Event

    def run(self) -> None: ...


def backlog(settings: Settings, rollouts: int) -> None:
    """Every rollout's spans, durable before the snapshots that end the attempts (as ``AttemptContext.finish``
    orders them: the triplet processor counts a span written after its attempt's end as late)."""
    events = EventProducer(settings, role="bench")
    now = time.time()
    ended: list[tuple[str, str]] = []
    for i in range(rollouts):
        rid, aid = f"ro-{uuid.uuid4().hex[:12]}", f"at-{i}"
        ctx = AttemptContext(events, rid, aid, resources_id="policy-v1")
        with ctx.span("agent.rollout"):
            with ctx.span("chat toy", LLM_ATTRS):
                pass
            with ctx.span("verify"):
                pass
            ctx.emit_reward(1.0)
        ended.append((rid, aid))
    events.flush(120)
    for i, (rid, aid) in enumerate(ended):
        attempt = AttemptSnapshot(attempt_id=aid, sequence_id=1, start_time=now, end_time=now, status="succeeded")
        events.send(events.topics.state, RolloutSnapshot(
            rollout_id=rid, version=2, input={"task": i}, start_time=now, end_time=now, mode="train",
            resources_id="policy-v1", status="succeeded", attempts=[attempt], updated_ns=time.time_ns()))
    events.flush(120)


def drain(broker_pid: int, target: Draining, done: Callable[[], bool]) -> tuple[float, ...]:
    """Seconds until ``done()`` (asked every 20 ms, reading counters only: the consumer's thread is not
    disturbed), with the CPU-seconds meanwhile of this process, of the thread running the consumer's loop (the
    figure other processes' load distorts least) and of the broker."""
    pids = {"self": os.getpid(), "broker": broker_pid}
    before = cpu_of(pids)
    start = time.perf_counter()
    thread = threading.Thread(target=target.run, daemon=True)
    thread.start()
    assert thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    while not done():
        if not thread.is_alive():
            raise RuntimeError("the consumer stopped early")
        time.sleep(0.02)
    seconds, loop_cpu = time.perf_counter() - start, time.clock_gettime(clock)
    after = cpu_of(pids)
    target.stop_event.set()
    thread.join(120)
    return seconds, after["self"] - before["self"], loop_cpu, after["broker"] - before["broker"]


def one_run(rollouts: int) -> dict[str, tuple[float, ...]]:
    spans = rollouts * SPANS_PER_ROLLOUT
    with embedded_broker(_Steps(), "consume_drain") as (broker, settings):  # type: ignore[arg-type]
        assert broker.proc is not None
        backlog(settings, rollouts)
        sink = SpanSink(settings)
        try:
            out = {"sink": drain(broker.proc.pid, sink, lambda: sink.stats["inserted"] >= spans)}
        finally:
            sink.close()
        processor = TripletProcessor(settings, limits=Limits(settle_ms=0))
        try:
            out["triplets"] = drain(broker.proc.pid, processor, lambda: processor.stats["attempts"] >= rollouts
                                    and not processor.collector.pending)
        finally:
            processor.close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    units = {"sink": ("spans", args.rollouts * SPANS_PER_ROLLOUT), "triplets": ("attempts", args.rollouts)}
    for _ in range(args.repeats):
        for name, (seconds, cpu, loop_cpu, broker_cpu) in one_run(args.rollouts).items():
            unit, n = units[name]
            print(f"{name}: {n:,} {unit} in {seconds:.2f} s: {n / seconds:,.0f} {unit}/s; CPU-seconds: this process "
                  f"{cpu:.2f} ({cpu / n * 1e6:.0f} us/{unit[:-1]}), its loop's thread {loop_cpu:.2f} "
                  f"({loop_cpu / n * 1e6:.0f} us/{unit[:-1]}), broker {broker_cpu:.2f}", flush=True)


if __name__ == "__main__":
    main()
