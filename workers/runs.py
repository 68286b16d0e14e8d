"""The training runs a data dir's history holds, read from its ClickHouse tables (``litstream runs``, the
dashboard's Training page).

A run is every rollout whose ``RolloutEnqueued`` event carries its run id (the driver of ``litstream train`` /
``Trainer.fit`` writes them), so what the log holds decides, not a file. From the tables:

* start and last event: the run's first and last rollout event;
* rollouts, and how many of them succeeded (an attempt of theirs succeeded);
* versions: the policy versions its steps made (``trained_on``, from the lineage records);
* reward by version and mode: the mean of the last reward of each rollout, with its standard error, per the
  resources the rollout ran with (``policy-vN`` by number) and its mode (``train`` / ``val``); the best validated
  version is the one with the highest validation mean (the earliest of equal ones).

The run's name and status come from the run's record in the data dir (``run.json``, written by the run), when there
is one: running while its process lives, else how it ended (finished, stopped, failed); a run killed by SIGKILL
has no end recorded.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from litstream.infra import health
from litstream.infra.clickhouse import QueryResult
from litstream.schemas.policy_versions import label_order, version_label

Run = Callable[[str], QueryResult]

_ENQUEUED = """
SELECT rollout_id, any(run_id) AS run, any(mode) AS rollout_mode
FROM rollout_events FINAL WHERE event_type = 'RolloutEnqueued' AND run_id != '' GROUP BY rollout_id"""
SQL_HAS_RUN_IDS = ("SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = 'rollout_events' "
                   "AND name = 'run_id'")
SQL_RUN_SPANS = """
SELECT run_id, toUnixTimestamp64Milli(min(timestamp)) / 1000 AS started,
       toUnixTimestamp64Milli(max(timestamp)) / 1000 AS last_event
FROM rollout_events FINAL WHERE run_id != '' GROUP BY run_id"""
SQL_RUN_ROLLOUTS = f"""
SELECT e.run AS run, count() AS rollouts, countIf(s.ok = 1) AS succeeded
FROM ({_ENQUEUED}) AS e
LEFT JOIN (SELECT rollout_id, 1 AS ok FROM rollout_events FINAL
           WHERE event_type IN ('AttemptStatusChanged', 'AttemptUpdated') AND status = 'succeeded'
           GROUP BY rollout_id) AS s ON e.rollout_id = s.rollout_id
GROUP BY run"""
SQL_RUN_VERSIONS = """
SELECT run_id, max(version) AS last_version, count() AS samples FROM trained_on FINAL WHERE run_id != ''
GROUP BY run_id"""
SQL_RUN_REWARDS = f"""
SELECT e.run AS run, r.last_resources AS resources, if(e.rollout_mode = '', 'unset', e.rollout_mode) AS run_mode,
       count() AS rollouts, avg(r.last_reward) AS mean,
       if(count() > 1, stddevSamp(r.last_reward) / sqrt(count()), 0) AS se,
       toUnixTimestamp64Milli(max(r.rewarded)) / 1000 AS last_rewarded
FROM ({_ENQUEUED}) AS e
JOIN (SELECT rollout_id, argMax(resources_id, Timestamp) AS last_resources, argMax(reward, Timestamp) AS last_reward,
             max(Timestamp) AS rewarded
      FROM spans FINAL WHERE reward IS NOT NULL GROUP BY rollout_id) AS r ON e.rollout_id = r.rollout_id
GROUP BY run, resources, run_mode"""


@dataclass
class Score:
    """The reward of one version in one mode: mean and standard error over its rollouts."""

    rollouts: int
    mean: float
    se: float
    after_s: float | None = None  # when its last reward came, in seconds after the run's start

    def text(self) -> str:
        return f"{self.mean:.3f} ± {self.se:.3f} ({self.rollouts})"

    def text_at(self) -> str:
        """:meth:`text` and when it was known: a run that reaches a reward sooner shows it here."""
        return self.text() + (f" at {self.after_s / 60:.0f} min" if self.after_s is not None else "")


@dataclass
class RunSummary:
    run_id: str
    started: float
    last_event: float
    name: str = ""
    status: str = "no record"  # from its record: running, finished, stopped, failed, killed (no end recorded)
    topic_prefix: str = ""  # where its log is (an embedded run's own topics), from its record
    warm_start: dict[str, Any] | None = None  # what its v0 was fine-tuned on (source run or file), from its record
    rollouts: int = 0
    succeeded: int = 0
    last_version: int | None = None
    trained_samples: int = 0
    validation: dict[str, Score] = field(default_factory=dict)  # by version label (``v3``, or a resources id)
    training: dict[str, Score] = field(default_factory=dict)

    @property
    def best(self) -> tuple[str, Score] | None:
        """The best validated version: the highest mean, the earliest of equal ones."""
        if not self.validation:
            return None
        order = sorted(self.validation, key=label_order)
        label = max(order, key=lambda k: (self.validation[k].mean, -order.index(k)))
        return label, self.validation[label]

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {"run_id": self.run_id, "name": self.name, "started": iso(self.started),
                "duration_s": round(self.last_event - self.started, 1), "status": self.status,
                "topic_prefix": self.topic_prefix, "warm_start": self.warm_start,
                "rollouts": self.rollouts, "succeeded": self.succeeded, "last_version": self.last_version,
                "trained_samples": self.trained_samples,
                "best": None if best is None else {"version": best[0], "mean": round(best[1].mean, 4),
                                                   "se": round(best[1].se, 4), "rollouts": best[1].rollouts},
                "validation": {k: _score_json(s) for k, s in sorted(self.validation.items(),
                                                                    key=lambda kv: label_order(kv[0]))},
                "training": {k: _score_json(s) for k, s in sorted(self.training.items(),
                                                                  key=lambda kv: label_order(kv[0]))}}


def _score_json(s: Score) -> dict[str, Any]:
    return {"mean": round(s.mean, 4), "se": round(s.se, 4), "rollouts": s.rollouts,
            "after_s": None if s.after_s is None else round(s.after_s, 1)}


def iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def list_runs(run: Run, records: dict[str, dict[str, Any]] | None = None) -> list[RunSummary]:
    """Every run the tables hold, oldest first, with the name and end its record gives (``run_records``)."""
    if not run(SQL_HAS_RUN_IDS).rows[0][0]:
        return []  # tables written before runs were recorded: no rollout names a run
    runs = {r[0]: RunSummary(r[0], float(r[1]), float(r[2])) for r in run(SQL_RUN_SPANS).rows}
    for run_id, n, succeeded in run(SQL_RUN_ROLLOUTS).rows:
        if run_id in runs:
            runs[run_id].rollouts, runs[run_id].succeeded = int(n), int(succeeded)
    for run_id, last_version, samples in run(SQL_RUN_VERSIONS).rows:
        if run_id in runs:
            runs[run_id].last_version, runs[run_id].trained_samples = int(last_version), int(samples)
    for run_id, resources_id, mode, n, mean, se, rewarded in run(SQL_RUN_REWARDS).rows:
        if run_id in runs and mode in ("val", "train"):
            scores = runs[run_id].validation if mode == "val" else runs[run_id].training
            scores[version_label(resources_id)] = Score(int(n), float(mean), _finite(se),
                                                        max(0.0, float(rewarded) - runs[run_id].started))
    for run_id, record in (records or {}).items():
        if run_id in runs:
            runs[run_id].name = str(record.get("name", ""))
            runs[run_id].status = record_status(record)
            runs[run_id].topic_prefix = str(record.get("topic_prefix", ""))
            warm = record.get("warm_start")
            runs[run_id].warm_start = warm if isinstance(warm, dict) else None
    return sorted(runs.values(), key=lambda r: r.started)


def record_status(record: dict[str, Any]) -> str:
    """How a run ended, as its record says; without an end, running while its process lives, else killed."""
    if record.get("ended"):
        return str(record["ended"])
    pid = record.get("pid")
    if not isinstance(pid, int):
        return "no end recorded"
    return "running" if health.pid_alive(pid) else "killed (no end recorded)"


def _finite(value: Any) -> float:
    v = float(value)
    return v if math.isfinite(v) else 0.0


def find(runs: Iterable[RunSummary], wanted: str) -> RunSummary:
    """The run whose id is ``wanted`` or starts with it, or whose name is it; a clear error otherwise."""
    runs = list(runs)
    exact = [r for r in runs if r.run_id == wanted]
    found = exact or [r for r in runs if r.run_id.startswith(wanted) or (wanted and r.name == wanted)]
    if len(found) == 1:
        return found[0]
    known = ", ".join(r.run_id for r in runs) or "none"
    if not found:
        raise LookupError(f"no run {wanted!r} in this history (runs: {known})")
    raise LookupError(f"{wanted!r} names {len(found)} runs: {', '.join(r.run_id for r in found)}")


def run_named(run: Run, data_dir: Path, wanted: str) -> RunSummary:
    """The run of ``data_dir``'s history that ``wanted`` names (:func:`find`), read through ``run``."""
    return find(list_runs(run, run_records(data_dir)), wanted)


RUN_FILE = "run.json"
RUNS_DIR = "runs"  # <data dir>/runs/<run id>.json: the records of runs that joined a stack


def run_records(data_dir: Path) -> dict[str, dict[str, Any]]:
    """The run records in a data dir, by run id: ``runs/<run id>.json`` of the runs of this data dir (embedded
    runs, and runs that joined its stack) or of the data dirs below it (``<run name>/runs/``), and the older
    ``run.json`` records. An unreadable record is skipped."""
    paths = [data_dir / RUN_FILE, *data_dir.glob(f"*/{RUN_FILE}"), *data_dir.glob(f"{RUNS_DIR}/*.json"),
             *data_dir.glob(f"*/{RUNS_DIR}/*.json")]  # a run's own record last: it has the most
    records: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            record = json.loads(path.read_text())
            records[str(record["run_id"])] = record
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return records


def compare_rows(runs: list[RunSummary]) -> list[list[str]]:
    """Validation reward by version, one column per run; '' where a run has no validation of that version."""
    labels = sorted({label for r in runs for label in r.validation}, key=label_order)
    return [[label, *(r.validation[label].text_at() if label in r.validation else "" for r in runs)]
            for label in labels]
