"""The lifecycle processor alone, draining a backlog: events/s, and the CPU it and the embedded broker spend.

``--rollouts`` rollouts are enqueued (``enqueue_many_rollouts``, batches of 500) before the processor starts; the
clock runs from the processor being ready until a fresh store's view shows every rollout ``queuing`` (each enqueue
folded, its snapshot and offer written). CPU-seconds of the broker and the processor come from /proc.
(docs/benchmarks.md, "Group commit of the processor's outputs ...")

    python -m bench.lifecycle_drain [--rollouts 10000] [--profile docs/perf/drain.svg]

``--profile PATH`` attaches py-spy (``pip install py-spy``) to the processor for the drain only (not its start or
stop) and writes its flame graph there (``.svg``), a speedscope profile (``.json``) or folded stacks (``.folded``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from litstream.app.stack import Stack
from litstream.schemas.models import EnqueueRolloutRequest
from litstream.workers.store import LitStore

from .lifecycle import embedded_broker
from .processes import cpu_of


class _Steps:
    """The part of the benchmarks' context that broker_settings uses."""

    def step(self, text: str) -> None:
        print(f"- {text}", flush=True)


async def enqueue(settings: Any, rollouts: int) -> None:
    store = LitStore(settings)
    try:
        requests = [EnqueueRolloutRequest(input={"task": i}, mode="train") for i in range(rollouts)]
        for i in range(0, rollouts, 500):
            await store.enqueue_many_rollouts(requests[i:i + 500])
    finally:
        await store.close()


async def wait_folded(settings: Any, rollouts: int) -> None:
    """Until a view that never enqueued anything shows every rollout on offer (the processor's snapshots)."""
    store = LitStore(settings)
    try:
        await store.wait_until_ready()
        while sum(1 for s in list(store.rollouts.snapshots.values()) if s.status == "queuing") < rollouts:
            await asyncio.sleep(0.05)
    finally:
        await store.close()


@contextmanager
def profiled(pid: int, path: Path | None, rate: int = 100) -> Iterator[None]:
    """py-spy on ``pid`` while the block runs (nothing without a path); stopped with SIGINT, as at a Ctrl-C."""
    if path is None:
        yield
        return
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy: pip install py-spy")
    fmt = {".json": "speedscope", ".folded": "raw"}.get(path.suffix, "flamegraph")
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking",
                             "--format", fmt, "-o", str(path)], stdout=subprocess.DEVNULL)
    time.sleep(0.5)  # attached before the clock starts
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=10_000)
    ap.add_argument("--profile", type=Path, default=None, help="py-spy flame graph (.svg), speedscope (.json) or folded stacks (.folded)")
    args = ap.parse_args(argv)
    with embedded_broker(_Steps(), "drain") as (broker, settings):  # type: ignore[arg-type]
        asyncio.run(enqueue(settings, args.rollouts))
        with Stack(settings) as stack:
            stack.start("lifecycle", "process", "lifecycle")
            stack.wait_ready("lifecycle", "lifecycle")
            assert broker.proc is not None
            pids = {"broker": broker.proc.pid, "lifecycle": stack.roles["lifecycle"].proc.pid}
            with profiled(pids["lifecycle"], args.profile):
                before = cpu_of(pids)
                start = time.perf_counter()
                asyncio.run(wait_folded(settings, args.rollouts))
                seconds = time.perf_counter() - start
                after = cpu_of(pids)
    cpu = ", ".join(f"{name} {after[name] - before[name]:.2f}" for name in before if name in after)
    print(f"folded {args.rollouts:,} enqueues in {seconds:.2f} s: {args.rollouts / seconds:,.0f} events/s; "
          f"CPU-seconds {cpu}")


if __name__ == "__main__":
    main()
