"""agent_loop: Agent Lightning 0.3.0's stock LightningStoreClient running its agent loop against each server.

Each of W agents (asyncio tasks with a client each, in the Agent Lightning virtualenv) loops until N rollouts are
enqueued: enqueue_rollout -> dequeue_rollout -> 10 x (get_next_span_sequence_id + add_span) ->
update_attempt(status="succeeded"); then wait_for_rollouts polls until all N succeeded. Run once with 1 agent and
once with 16, against:

* litstream: the gateway's /v1/agl, with the lifecycle processor and the span sink behind it and the embedded
  broker, each a process of its own;
* Agent Lightning 0.3.0: LightningStoreServer(InMemoryLightningStore()) in a process of its own.

Reported: rollouts/s per agent count, p50/p90 of every call kind (the same client code times both), and the
CPU-milliseconds per rollout of each server's whole process tree over each run (litstream: every process of the
stack, the broker's JVM included, and again without it; the reference: its server's process). Each side
first runs 100 rollouts through the same loop untimed (``Sizes.warmup``): the broker's JVM compiles its hot code
in its first thousands of requests (a produce's acknowledgement took 0.8 ms p50 over a fresh broker's first 300,
0.23-0.29 ms once warm).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from litstream.app.stack import Stack
from litstream.infra.broker import free_port

from .harness import Context, Report, Row
from .kafka_codec import span_variants
from .lifecycle import AGL, agl_baseline, embedded_broker
from .processes import cpu_of

TITLE = "the stock client's agent loop (enqueue -> dequeue -> 10 spans -> succeeded), gateway vs Agent Lightning 0.3.0"


@dataclass(frozen=True)
class Sizes:
    n: int  # rollouts per agent count
    workers: tuple[int, ...] = (1, 16)
    spans: int = 10
    warmup: int = 100  # rollouts through the loop first, untimed, on each side (the broker's JVM compiles its hot code)


FULL = Sizes(n=400)
QUICK = Sizes(n=32, warmup=0)

LIT = "litstream agent loop (stock LightningStoreClient -> gateway /v1/agl)"
REF = f"{AGL} agent loop (same client -> LightningStoreServer over InMemory)"
CALL_KINDS = ("enqueue_rollout", "dequeue_rollout", "get_next_span_sequence_id", "add_span", "update_attempt",
              "get_rollout_by_id", "query_spans")  # the last two: 50 finished rollouts read after the loop


def _config(sizes: Sizes, url: str | None, cpu_pids: dict[str, list[int]] | None = None) -> dict[str, Any]:
    return {"mode": "agent_loop", "url": url, "n": sizes.n, "workers": list(sizes.workers), "spans": sizes.spans,
            "variants": span_variants(), "empty_sleep_s": 0.01, "warmup": sizes.warmup, "cpu_pids": cpu_pids}


CPU = "CPU-ms per rollout"


def cpu_label(side: str, workers: int) -> str:
    return f"{side} agent loop {CPU}, {workers} agent{'s' if workers > 1 else ''}"


CpuParts = tuple[tuple[str, ...], str | None]  # the process groups added up, and one part of them taken away


def _cpu_rows(sizes: Sizes, result: dict[str, Any], groups: dict[str, CpuParts]) -> list[Row]:
    """Per agent count and per label (the process groups it adds up, less one part of them or None), the CPU-ms
    per rollout."""
    rows = []
    for w in sizes.workers:
        spent = result["runs"][str(w)].get("cpu_ms_per_rollout", {})
        for side, (added, taken) in groups.items():
            if all(p in spent for p in added):
                ms = sum(spent[p] for p in added) - (spent.get(taken, 0.0) if taken else 0.0)
                what = " + ".join(added) + (f", less {taken}" if taken else "")
                rows.append(Row(cpu_label(side, w), value=ms, note=f"CPU-ms per rollout ({what})"))
    return rows


def _labels(prefix: str, sizes: Sizes) -> list[str]:
    return [f"{prefix}, {w} agent{'s' if w > 1 else ''}" for w in sizes.workers]


def _latencies(run: dict[str, Any]) -> str:
    calls = run["calls"]
    return "; ".join(f"{k} p50 {calls[k]['p50_ms']:.1f} / p90 {calls[k]['p90_ms']:.1f} ms"
                     for k in CALL_KINDS if k in calls)


def _rows(prefix: str, sizes: Sizes, result: dict[str, Any]) -> list[Row]:
    rows = []
    for label, w in zip(_labels(prefix, sizes), sizes.workers):
        run = result["runs"][str(w)]
        rows.append(Row(label, msgs_per_s=run["rollouts"] / run["wall_s"], n=run["rollouts"],
                        samples_s=[run["wall_s"]],
                        note=f"rollouts/s; {_latencies(run)}; empty dequeues {run['empty_dequeues']}"))
    return rows


def _cpu_note(before: dict[str, float], after: dict[str, float]) -> str:
    spent = ", ".join(f"{name} {after[name] - before[name]:.1f}" for name in before if name in after)
    return f"CPU-seconds of each process over both agent counts: {spent}"


def run(ctx: Context) -> Report:
    sizes = QUICK if ctx.quick else FULL
    rows: list[Row] = []
    params: dict[str, Any] = {**asdict(sizes), "rate": "rollouts/s"}
    with embedded_broker(ctx, "agent_loop") as (broker, settings), Stack(settings) as stack:
        ctx.step("starting the lifecycle processor, the span sink and the gateway")
        url = stack.start_store(free_port())
        assert broker.proc is not None
        pids = {"broker": broker.proc.pid, **{name: role.proc.pid for name, role in stack.roles.items()}}
        groups = {"broker": [broker.proc.pid], "stack": [pid for name, pid in pids.items() if name != "broker"]}
        before = cpu_of(pids)
        lit, missing = agl_baseline(ctx, _config(sizes, url, groups), _labels(LIT, sizes))
        cpu_note = _cpu_note(before, cpu_of(pids))
    if lit is None:
        rows += missing or [Row(label, note="skipped (--no-agl: the stock client lives in the Agent Lightning venv)")
                            for label in _labels(LIT, sizes)]
    else:
        rows += _rows(LIT, sizes, lit)
        rows += _cpu_rows(sizes, lit, {"litstream": (("stack", "broker"), None),
                                       "litstream without the broker": (("stack",), None)})
        rows += _cpu_rows(sizes, lit, {"litstream, the broker's JIT compiler apart": (("stack", "broker"), "broker jit")})
        rows.append(Row("litstream agent loop: where the CPU went", note=cpu_note))
        params["litstream"] = lit["runs"]
        params["litstream_cpu_note"] = cpu_note
    ref, missing = agl_baseline(ctx, _config(sizes, None), _labels(REF, sizes))
    if ref is None:
        rows += missing
    else:
        rows += _rows(REF, sizes, ref)
        rows += _cpu_rows(sizes, ref, {AGL: (("server",), None)})
        params["agl"] = ref["runs"]
    return Report(rows, params)
