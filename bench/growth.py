"""growth: whether the rate, the memory and the reads stay flat as rollouts pile up, litstream beside Agent
Lightning 0.3.0 in one run.

The stock client's agent loop (``agent_loop``: enqueue -> dequeue -> 10 spans -> succeeded) at 16 agents, for
``--rollouts`` rollouts in four quarters, against litstream's whole ``litstream up`` stack (the embedded broker,
its log on disk, the lifecycle processor, the span sink, the gateway), then against the reference's
``LightningStoreServer`` over its in-memory store. After each quarter: the quarter's rollouts/s and the resident
memory of each process (litstream: each role and the broker, each with its children; the reference: its server).
After the first and the last quarter: the p50 of ``get_rollout_by_id`` and ``query_spans`` over 50 rollouts of
that quarter, read one after the other as an algorithm reads what it trains on (after the last, the first
quarter's 50 again), and of a ``query_rollouts`` page of 100 (the newest, and from the middle of the list).

    python -m bench.growth                                # 4,000 rollouts, ~5 minutes
    python -m bench.growth --rollouts 100000 --no-agl     # litstream's side of 100,000: ~1.5 hours on 2 cores
    python -m bench.growth --rollouts 100000 --no-litstream  # the reference's: 2 hours or more, ~10 GiB

Writes ``bench/results/growth-<UTC time>.json`` and prints the table as Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from litstream.app.stack import Stack
from litstream.infra.broker import free_port

from .agent_loop import Sizes, _config
from .harness import RESULTS_DIR, Context, agl_python, machine, run_agl_reference
from .lifecycle import AGL, embedded_broker

AGENTS = 16
RUN_TIMEOUT_S = 12 * 3600.0  # one side of the largest run takes hours on a small machine


def run_side(cfg: dict[str, Any], console: Console, label: str) -> dict[str, Any]:
    """One side's four quarters through bench/agl_reference.py (its progress shown as it goes)."""
    console.print(f"[bold]{label}[/]: {cfg['n']:,} rollouts at {AGENTS} agents")
    result = run_agl_reference(cfg, console, timeout=RUN_TIMEOUT_S, show_progress=True)
    if isinstance(result, str):
        raise RuntimeError(f"{label}: {result}")
    return result


def litstream_side(ctx: Context, rollouts: int) -> dict[str, Any]:
    with embedded_broker(ctx, "growth") as (broker, settings), Stack(settings) as stack:
        ctx.step("starting the lifecycle processor, the span sink and the gateway")
        url = stack.start_store(free_port())
        assert broker.proc is not None
        rss = {"broker": [broker.proc.pid], **{name: [role.proc.pid] for name, role in stack.roles.items()}}
        cfg = {**_config_for(rollouts, url), "rss_pids": rss}
        return run_side(cfg, ctx.console, "litstream")


def _config_for(rollouts: int, url: str | None) -> dict[str, Any]:
    return {**_config(Sizes(n=rollouts, workers=(AGENTS,), warmup=0), url), "mode": "growth", "agents": AGENTS}


def markdown(sides: dict[str, dict[str, Any]]) -> str:
    """One table: per side, each quarter's rate and memory, and the reads' p50 at the start and the end."""
    lines = ["| | quarter 1 | quarter 2 | quarter 3 | quarter 4 |", "|---|---:|---:|---:|---:|"]
    for side, result in sides.items():
        quarters = result["quarters"]
        lines.append(f"| {side}: rollouts/s | " + " | ".join(f"{q['rollouts'] / q['wall_s']:.1f}" for q in quarters)
                     + " |")
        for name in quarters[0]["rss_mib"]:
            lines.append(f"| {side}: {name} RSS (MiB) | "
                         + " | ".join(f"{q['rss_mib'][name]:,.0f}" for q in quarters) + " |")
        for call in ("get_rollout_by_id", "query_spans"):
            first, last = quarters[0]["reads"][call], quarters[-1]["reads"][call]
            again = quarters[-1].get("first_quarter_reads", {}).get(call)
            lines.append(f"| {side}: {call} p50 (ms), the quarter's rollouts | {first['p50_ms']:.1f} | | | "
                         f"{last['p50_ms']:.1f}" + (f" (quarter 1's: {again['p50_ms']:.1f})" if again else "") + " |")
        for page in quarters[0].get("pages", {}):
            first, last = quarters[0]["pages"][page], quarters[-1]["pages"][page]
            lines.append(f"| {side}: {page} p50 (ms) | {first['p50_ms']:.1f} | | | {last['p50_ms']:.1f} |")
    return "\n".join(lines)


def merged(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """The sides of several saved runs, each side from the last file that has it."""
    sides: dict[str, dict[str, Any]] = {}
    for path in paths:
        sides.update(json.loads(path.read_text())["sides"])
    return sides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.growth", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=4000, help="rollouts per side, in four quarters")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--no-agl", action="store_true", help="litstream only")
    which.add_argument("--no-litstream", action="store_true",
                       help="the reference only (a run longer than one sitting, one side at a time)")
    which.add_argument("--merge", type=Path, nargs="+", metavar="RESULT",
                       help="print one table of the sides in these saved results (runs of one side each)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    if args.merge:
        print(markdown(merged(args.merge)))
        return 0
    _, reason = agl_python(console)
    if reason:  # the stock client is the load on both sides: it lives in the Agent Lightning venv
        console.print(f"[red]the Agent Lightning virtualenv is needed: {reason}[/]")
        return 1
    ctx = Context(quick=False, agl=not args.no_agl, console=console)
    sides = {} if args.no_litstream else {"litstream": litstream_side(ctx, args.rollouts)}
    if ctx.agl:
        sides[AGL] = run_side(_config_for(args.rollouts, None), console, AGL)
    table = markdown(sides)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"growth-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps({"benchmark": "growth", "rollouts": args.rollouts, "agents": AGENTS,
                                "machine": machine(), "sides": sides, "markdown": table}, indent=2) + "\n")
    print(table)
    console.print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
