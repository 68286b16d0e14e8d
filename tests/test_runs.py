"""`litstream runs`, `runs show` and `runs compare`: the training runs a history holds, from its ClickHouse tables
as the pipeline stores them (two runs' rollouts, rewards and lineage, and a rollout written before runs were
recorded), with the name and status of each run's record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from litstream.infra.clickhouse import ClickHouse
from litstream.infra.settings import Settings
from litstream.schemas.events import (
    AttemptStatusChanged,
    Event,
    EventFactory,
    RolloutEnqueued,
    TrainedSample,
    VersionTrained,
)
from litstream.streams.event_rows import Positioned, event_arrow, lineage_arrow
from litstream.streams.span_rows import span_arrow
from litstream.workers.runs import RunSummary, find, list_runs, run_records
from tests.samples import span, stored_history

A, B = "run-20261128T100000Z-aaaaaa", "run-20261129T100000Z-bbbbbb"
# (rollout, run, mode, version it ran with, reward)
ROLLOUTS = [("ro-a1", A, "train", 0, 0.0), ("ro-a2", A, "train", 0, 1.0), ("ro-a3", A, "val", 0, 0.0),
            ("ro-a4", A, "val", 0, 1.0), ("ro-a5", A, "val", 1, 1.0), ("ro-a6", A, "val", 1, 1.0),
            ("ro-b1", B, "val", 0, 1.0), ("ro-b2", B, "val", 0, 0.0), ("ro-old", None, "val", 0, 1.0)]


def _events(rid: str, run_id: str | None, mode: str, version: int) -> list[Event]:
    factory = EventFactory(role="test", run_id=run_id)
    return [RolloutEnqueued(meta=factory.meta(rid), input={}, start_time=time.time(), mode=mode,  # type: ignore[arg-type]
                            resources_id=f"policy-v{version}"),
            AttemptStatusChanged(meta=factory.meta(rid), attempt_id=f"at-{rid}", status="succeeded", time=time.time())]


def _reward(rid: str, version: int, reward: float) -> object:
    return span(1, rollout_id=rid, attempt_id=f"at-{rid}").model_copy(update={
        "name": "agentlightning.annotation", "attributes": {"agentlightning.reward.0.value": reward},
        "resources_id": f"policy-v{version}"})


@pytest.fixture
def history(tmp_path: Path) -> Iterator[Path]:
    """A data dir whose ClickHouse holds both runs, and the records the runs wrote: A finished, B killed."""
    events = [e for rid, run, mode, version, _ in ROLLOUTS for e in _events(rid, run, mode, version)]
    trained = VersionTrained(**EventFactory(role="test").stamp(), resources_id="policy-v1", run_id=A, version=1,
                             time=time.time(), window="count",
                             samples=[TrainedSample(rollout_id=rid, attempt_id=f"at-{rid}", group_id="t", index=0,
                                                    policy_version=0, reward=r) for rid, _, _, _, r in ROLLOUTS[:2]])
    data_dir = stored_history(tmp_path / "data", {
        "rollout_events": event_arrow([Positioned(e, 0, i) for i, e in enumerate(events)]),
        "spans": span_arrow([_reward(rid, v, r) for rid, _, _, v, r in ROLLOUTS]),  # type: ignore[misc]
        "trained_on": lineage_arrow([trained, trained])})  # sent twice: collapses
    settings = Settings(data_dir=data_dir)
    runs_dir = settings.data_dir / "runs"
    runs_dir.mkdir(parents=True)
    (runs_dir / f"{A}.json").write_text(json.dumps({"run_id": A, "name": "first", "pid": os.getpid(),
                                                    "ended": "finished"}))
    (runs_dir / f"{B}.json").write_text(json.dumps({"run_id": B, "name": "second", "pid": 2**22 + 1}))
    yield settings.data_dir


def test_the_runs_of_a_history_with_their_versions_rewards_and_status(history: Path) -> None:
    ch = ClickHouse(Settings(data_dir=history).resolved_clickhouse_dsn, role="test")
    try:
        first, second = list_runs(ch.query, run_records(history))  # the rollout without a run id is no run
    finally:
        ch.close()
    assert (first.run_id, first.name, first.status) == (A, "first", "finished")
    assert (second.run_id, second.name, second.status) == (B, "second", "killed (no end recorded)")
    assert (first.rollouts, first.succeeded, first.last_version, first.trained_samples) == (6, 6, 1, 2)
    assert (second.rollouts, second.last_version) == (2, None)
    assert {k: (s.rollouts, s.mean) for k, s in first.validation.items()} == {"v0": (2, 0.5), "v1": (2, 1.0)}
    assert {k: (s.rollouts, s.mean) for k, s in first.training.items()} == {"v0": (2, 0.5)}
    assert first.validation["v0"].se == pytest.approx(0.5) and first.validation["v1"].se == 0.0
    assert first.best is not None and first.best[0] == "v1"
    assert all(s.after_s is not None and s.after_s >= 0 for s in first.validation.values())  # when it was known
    assert second.best is not None and second.best[0] == "v0" and second.training == {}


def _cli(history: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "litstream.app.cli", "runs", *args], capture_output=True, text=True,
                          env={**os.environ, "LITSTREAM_DATA_DIR": str(history), "COLUMNS": "200"}, timeout=120)


def test_runs_show_and_compare_from_the_command_line(history: Path) -> None:
    listed = _cli(history, "--json")
    assert listed.returncode == 0, listed.stderr
    first, second = (json.loads(line) for line in listed.stdout.splitlines())
    assert first["run_id"] == A and first["best"] == {"version": "v1", "mean": 1.0, "se": 0.0, "rollouts": 2}
    assert second["status"] == "killed (no end recorded)" and second["last_version"] is None

    table = _cli(history)
    assert table.returncode == 0 and A in table.stdout and "v1 1.000±0.000" in table.stdout

    shown = _cli(history, "show", "run-20261129")  # a prefix of the id; its name works as well
    assert shown.returncode == 0 and "second" in shown.stdout and "0.500 ± 0.500 (2)" in shown.stdout

    compared = _cli(history, "compare", "first", B)
    assert compared.returncode == 0, compared.stderr
    rows = {line.split("│")[1].strip(): line for line in compared.stdout.splitlines() if line.startswith("│")}
    assert rows["v0"].count("0.500 ± 0.500 (2)") == 2  # both runs validated v0
    assert rows["v1"].count("1.000 ± 0.000 (2) at ") == 1 and "v1 1.000" in rows["best"]

    ambiguous = _cli(history, "show", "run-2026")
    assert ambiguous.returncode == 2 and "names 2 runs" in ambiguous.stderr


def test_a_run_is_named_by_its_id_a_prefix_or_its_name() -> None:
    runs = [RunSummary(A, 1.0, 2.0, name="first"), RunSummary(B, 3.0, 4.0, name="second")]
    assert find(runs, "second").run_id == B and find(runs, A).run_id == A and find(runs, "run-20261128").name == "first"
    with pytest.raises(LookupError, match="no run 'nope'"):
        find(runs, "nope")
