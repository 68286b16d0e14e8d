"""Where a Store API call's time goes on its two trips through the broker, per call kind.

An embedded broker, the lifecycle processor as a process, a LitStore in this process (as ``rollout_cycles`` runs
them). ``--rollouts`` rollouts each go through enqueue_rollout, dequeue_rollout, get_next_span_sequence_id and
update_attempt(succeeded), ``--in-flight`` at a time. Printed: the p50/p90 of each call, and of the two halves of
the lifecycle calls' round trip, read from the records themselves: from the event's making (its ``timestamp_ns``,
stamped by this process) to the processor producing the snapshot that answers it (the snapshot record's
timestamp), and from there to this process's view reading that snapshot. One clock: every process is on this
machine.

``--profile DIR`` attaches py-spy (``pip install py-spy``) to the processor and to this process while the calls
run and writes ``request-path-lifecycle.svg`` and ``request-path-store.svg`` there.

    python -m bench.request_hops [--rollouts 200] [--in-flight 1] [--profile docs/perf]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from litstream.app.stack import Stack
from litstream.schemas.codec import DecodeError
from litstream.schemas.events import RolloutSnapshot
from litstream.streams import views
from litstream.workers.store import LitStore

from .lifecycle import embedded_broker, in_flight, open_store, percentile
from .lifecycle_drain import _Steps, profiled

CALLS = ("enqueue_rollout", "dequeue_rollout", "get_next_span_sequence_id", "update_attempt")


class HopClock:
    """Wraps the views' batch poll: for each snapshot read, (fold trip, snapshot trip) in seconds."""

    def __init__(self, store: LitStore) -> None:
        self.codec = store.codec
        self.hops: list[tuple[float, float]] = []
        self._poll = views.poll_batch

    def __enter__(self) -> HopClock:
        def poll(c: Any, timeout: float, max_records: int = 1000) -> list[Any]:
            msgs = self._poll(c, timeout, max_records)
            now = time.time()
            for m in msgs:
                if m.error() is None and (m.topic() or "").endswith(".rollout-state"):
                    self._record(m, now)
            return msgs

        views.poll_batch = poll
        return self

    def _record(self, msg: Any, now: float) -> None:
        try:
            snap = self.codec.decode_as(msg.value(), RolloutSnapshot)
        except DecodeError:
            return
        produced = msg.timestamp()[1] / 1000
        self.hops.append((produced - snap.updated_ns / 1e9, now - produced))

    def __exit__(self, *_exc: Any) -> None:
        views.poll_batch = self._poll


async def calls(settings: Any, rollouts: int, concurrency: int, profile: Path | None,
                lifecycle_pid: int) -> tuple[dict[str, list[float]], list[tuple[float, float]], float]:
    """Every rollout through the four calls; seconds per call kind, the snapshots' hops, and the wall time."""
    store = await open_store(settings)
    seconds: dict[str, list[float]] = {name: [] for name in CALLS}

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        await store.enqueue_rollout({"task": i}, mode="train")
        t1 = time.perf_counter()
        got = None
        while got is None:
            got = await store.dequeue_rollout()
        t2 = time.perf_counter()
        await store.get_next_span_sequence_id(got.rollout_id, got.attempt.attempt_id)
        t3 = time.perf_counter()
        await store.update_attempt(got.rollout_id, "latest", status="succeeded")
        t4 = time.perf_counter()
        for name, took in zip(CALLS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            seconds[name].append(took)

    try:
        with HopClock(store) as clock, ExitStack() as spies:
            for name, pid in (("lifecycle", lifecycle_pid), ("store", os.getpid())):
                spies.enter_context(profiled(pid, profile / f"request-path-{name}.svg" if profile else None))
            start = time.perf_counter()
            await in_flight(list(range(rollouts)), one, concurrency)
            wall = time.perf_counter() - start
    finally:
        await store.close()
    return seconds, clock.hops, wall


def lines(seconds: dict[str, list[float]], hops: list[tuple[float, float]]) -> Iterator[str]:
    def ms(values: list[float]) -> str:
        return f"p50 {percentile(values, 50) * 1000:7.2f} ms  p90 {percentile(values, 90) * 1000:7.2f} ms"

    for name, values in seconds.items():
        yield f"  {name:28s} {ms(values)}"
    if hops:
        yield f"  {'event made -> snapshot out':28s} {ms([h[0] for h in hops])}  (store, broker, processor)"
        yield f"  {'snapshot out -> view read':28s} {ms([h[1] for h in hops])}  (processor, broker, store)"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=200)
    ap.add_argument("--in-flight", type=int, default=1)
    ap.add_argument("--profile", type=Path, default=None, help="a directory for the flame graphs (py-spy)")
    args = ap.parse_args(argv)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    with embedded_broker(_Steps(), "hops") as (_broker, settings), Stack(settings) as stack:  # type: ignore[arg-type]
        stack.start("lifecycle", "process", "lifecycle")
        stack.wait_ready("lifecycle", "lifecycle")
        seconds, hops, wall = asyncio.run(calls(settings, args.rollouts, args.in_flight, args.profile,
                                                stack.roles["lifecycle"].proc.pid))
    print(f"{args.rollouts} rollouts, {args.in_flight} in flight: {args.rollouts / wall:,.1f} cycles/s "
          f"(load average {os.getloadavg()[0]:.1f})")
    for line in lines(seconds, hops):
        print(line)


if __name__ == "__main__":
    main()
