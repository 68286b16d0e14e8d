"""``python -m bench [--only NAME] [--quick] [--no-agl] [--cpus LIST] [--prepare-baseline]``: run benchmarks,
print, save JSON."""

from __future__ import annotations

import os

# Before anything imports a numeric library: one thread each, so the rates are per core and comparable.
os.environ["OMP_NUM_THREADS"] = "1"

import argparse
import importlib
import sys
import time
from pathlib import Path

from rich.console import Console

from .harness import (
    BENCHMARKS,
    RESULTS_DIR,
    Context,
    Report,
    agl_python,
    machine,
    print_machine,
    print_report,
    save,
)
from .summary import markdown, print_summary, rows_of, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), metavar="NAME",
                        help=f"run only this benchmark (repeatable): {', '.join(sorted(BENCHMARKS))}")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and one repeat: a smoke test, not numbers to quote")
    parser.add_argument("--no-agl", action="store_true",
                        help="skip the Agent Lightning baseline (and building its virtualenv)")
    parser.add_argument("--prepare-baseline", action="store_true",
                        help="only create the Agent Lightning virtualenv (.venv-agl) if it is missing, then exit")
    parser.add_argument("--cpus", type=cpu_list, default=None, metavar="LIST",
                        help="run every process of the run (litstream's, the broker's, the reference's) on these "
                             "CPUs only, e.g. 0 or 0-1: how the figures change with the cores at hand")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                        help=f"where to save the JSON (default {RESULTS_DIR})")
    args = parser.parse_args(argv)
    if args.cpus is not None:
        os.sched_setaffinity(0, args.cpus)  # every process started from here on inherits it

    console = Console()
    if not console.is_terminal:  # piped (make, CI logs): wide enough that rows do not wrap
        console = Console(width=150)
    if args.prepare_baseline:
        python, reason = agl_python(console)
        if python is None:
            console.print(f"[red]the Agent Lightning virtualenv could not be made:[/] {reason}")
            return 1
        console.print(f"Agent Lightning baseline ready: {python}")
        return 0
    m = machine()
    print_machine(console, m)
    ctx = Context(quick=args.quick, agl=not args.no_agl, console=console)
    failed: list[str] = []
    reports = run_all(args, ctx, m, failed)
    lines = summary(reports)
    if lines:
        console.rule("[bold]summary[/]: litstream beside the reference, this run")
        print_summary(console, lines)
        path = save(args.results_dir, "summary", m, Report(rows_of(lines)), quick=args.quick, elapsed_s=0.0)
        md = path.with_suffix(".md")
        md.write_text(markdown(lines))
        console.print(f"saved {path} and {md.name} (the table as Markdown, for the README)")
    return 1 if failed else 0


def cpu_list(text: str) -> set[int]:
    """``0``, ``0,1`` or ``0-3`` as a set of CPU numbers, each one this machine has."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise argparse.ArgumentTypeError(f"not a CPU list: {text!r} (e.g. 0, 0,1 or 0-3)")
        cpus.update(range(int(first), int(last or first) + 1))
    unknown = cpus - os.sched_getaffinity(0)
    if unknown:
        raise argparse.ArgumentTypeError(f"CPUs {sorted(unknown)} are not available here "
                                         f"(available: {sorted(os.sched_getaffinity(0))})")
    return cpus


def run_all(args: argparse.Namespace, ctx: Context, m: dict[str, object], failed: list[str]) -> dict[str, Report]:
    """Run the chosen benchmarks in turn; their reports by name (a failed one is left out and named in
    ``failed``)."""
    reports: dict[str, Report] = {}
    console = ctx.console
    for name in args.only or list(BENCHMARKS):
        module = importlib.import_module(BENCHMARKS[name])
        console.rule(f"[bold]{name}[/]: {module.TITLE}" + (" (--quick)" if args.quick else ""))
        start = time.perf_counter()
        try:
            report = module.run(ctx)
        except Exception as exc:  # one broken benchmark should not hide the others' numbers
            console.print(f"[red]{name} failed:[/] {type(exc).__name__}: {exc}")
            failed.append(name)
            continue
        elapsed = time.perf_counter() - start
        print_report(console, f"{name} ({elapsed:.0f} s)", report)
        path = save(args.results_dir, name, m, report, quick=args.quick, elapsed_s=elapsed)
        console.print(f"saved {path}")
        reports[name] = report
    return reports


if __name__ == "__main__":
    sys.exit(main())
