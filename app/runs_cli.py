"""``litstream runs``, ``runs show ID`` and ``runs compare A B``: the training runs of this data dir's history."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from litstream.workers import runs as rs

from .cli_common import ch_reader, console, err, fail, load_settings

EXAMPLE = """\b
Examples:
  LITSTREAM_DATA_DIR=.litstream/train litstream runs
  litstream runs --json | jq .best
  litstream runs show run-20261128T103200Z-1a2b3c
  litstream runs compare run-20261128T1032 run-20261129T0915
"""


def _runs() -> list[rs.RunSummary]:
    settings = load_settings()
    try:
        with ch_reader(settings) as run:
            return rs.list_runs(run, rs.run_records(settings.data_dir))
    except Exception as exc:  # noqa: BLE001 (the query's or the connection's error, said plainly)
        fail(str(exc).strip().splitlines()[0])


def _found(runs: list[rs.RunSummary], wanted: str) -> rs.RunSummary:
    try:
        return rs.find(runs, wanted)
    except LookupError as exc:
        fail(str(exc), code=2)


def _best(r: rs.RunSummary) -> str:
    best = r.best
    return f"{best[0]} {best[1].mean:.3f}±{best[1].se:.3f}" if best else ""


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{s:02d}s"


@click.group(invoke_without_command=True, epilog=EXAMPLE)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run, a line each.")
@click.pass_context
def runs(ctx: click.Context, as_json: bool) -> None:
    """The training runs this data dir's history holds: name, id, start, duration, versions, the best validated
    version and its reward, rollouts and status, oldest first."""
    if ctx.invoked_subcommand is not None:
        return
    found = _runs()
    if as_json:
        for r in found:
            click.echo(json.dumps(r.to_json()))
        return
    if not found:
        err.print("no training runs in this history: a run's rollouts carry its id (`litstream train`, "
                  "`Trainer.fit`), and rollouts written before runs were recorded carry none")
        return
    names = {r.name for r in found}
    table = Table(title="Training runs" + (f" ({next(iter(names))})" if len(names) == 1 else ""),
                  title_justify="left")
    if len(names) > 1:  # a column only where the runs' names differ
        table.add_column("name")
    table.add_column("id", no_wrap=True)
    for column in ("started (UTC)", "took", "versions", "best validated", "rollouts", "status"):
        table.add_column(column)
    for r in found:
        table.add_row(*([r.name] if len(names) > 1 else []), r.run_id, rs.iso(r.started)[5:16],
                      _duration(r.last_event - r.started), "" if r.last_version is None else str(r.last_version),
                      _best(r), str(r.rollouts), r.status)
    console.print(table)


@runs.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="The run as one JSON object.")
def show(run_id: str, as_json: bool) -> None:
    """One run: its summary, its rollouts' outcomes and its reward by version (training and validation). RUN_ID
    is the id, a unique prefix of it, or the run's name."""
    r = _found(_runs(), run_id)
    record: dict[str, Any] = r.to_json()
    if as_json:
        click.echo(json.dumps(record))
        return
    console.print(f"[bold]{r.name or 'run'}[/] {r.run_id}: {record['status']}; started {record['started']} UTC, "
                  f"{_duration(r.last_event - r.started)}; {r.rollouts} rollouts, {r.succeeded} succeeded")
    if r.warm_start:
        console.print(f"  warm start: v0 fine-tuned on {r.warm_start.get('trajectories')} trajectories of "
                      f"{escape(str(r.warm_start.get('source')))}")
    if r.last_version is not None:
        console.print(f"  versions 1-{r.last_version} trained on {r.trained_samples} triplets; best validated "
                      f"{_best(r) or 'none'}")
    table = Table(title="Reward by version: mean ± standard error (rollouts)", title_justify="left")
    for column in ("version", "training", "validation"):
        table.add_column(column)
    labels = sorted(set(r.training) | set(r.validation), key=rs.label_order)
    for label in labels:
        table.add_row(label, r.training[label].text() if label in r.training else "",
                      r.validation[label].text_at() if label in r.validation else "")
    console.print(table)


@runs.command("compare")
@click.argument("run_ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: each run's validation by version.")
def compare(run_ids: tuple[str, ...], as_json: bool) -> None:
    """Validation reward by version of two or more runs, side by side."""
    if len(run_ids) < 2:
        raise click.UsageError("give two or more runs to compare")
    found = _runs()
    chosen = [_found(found, wanted) for wanted in run_ids]
    if as_json:
        click.echo(json.dumps({r.run_id: r.to_json()["validation"] for r in chosen}))
        return
    table = Table(title="Validation reward by version: mean ± standard error (rollouts)", title_justify="left")
    table.add_column("version")
    for r in chosen:
        table.add_column(f"{r.name} {r.run_id}" if r.name else r.run_id)
    for row in rs.compare_rows(chosen):
        table.add_row(*row)
    table.add_row("best", *(_best(r) for r in chosen))
    console.print(table)
