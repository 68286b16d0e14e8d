"""``litstream report``: what the spans and the lifecycle log say, as SQL over ClickHouse.

Every query runs unchanged on chDB and on a ClickHouse server (plain SQL, no engine-specific functions), and reads
the ReplacingMergeTree tables with ``FINAL``, so a redelivered span or event is never counted twice. Sections:

* reward by resources version: the reward spans (``reward`` is materialised from ``agentlightning.annotation``
  spans), per ``resources_id``; policy versions (``policy-vN``) in numeric order;
* reward over time, per version: mean reward per time bucket (the bucket fits the data's time range);
* latency by span name and model: p50 / p95 / max of ``Duration`` (exact quantiles), and the share of spans with
  status ``Error``;
* token usage by model: ``input_tokens`` / ``output_tokens`` (materialised from either spelling of
  ``gen_ai.usage.*``), over spans that carry usage; and over time;
* attempts: from ``rollout_events``. An attempt is a (rollout, attempt number) that was started (a claim that lost
  its race has the number of the winner and is not counted twice); a retry is an attempt numbered above 1; an
  attempt's outcome is its first terminal status in the log (``succeeded``, ``failed``, ``timeout``,
  ``unresponsive``), as the fold keeps it; rates are over attempts with an outcome.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from litstream.infra.clickhouse import QueryResult
from litstream.schemas.policy_versions import resources_order

Run = Callable[[str], QueryResult]
TERMINAL = ("succeeded", "failed", "timeout", "unresponsive")
_BUCKETS_S = (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 86400, 7 * 86400)


@dataclass
class Section:
    name: str
    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "columns": self.columns, "rows": self.rows, "note": self.note}

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r)) for r in self.rows]


@dataclass
class Report:
    sections: dict[str, Section] = field(default_factory=dict)
    bucket_s: int = 60

    def add(self, section: Section) -> None:
        self.sections[section.name] = section

    def to_json(self) -> dict[str, Any]:
        return {"bucket_s": self.bucket_s, "sections": {k: s.to_json() for k, s in self.sections.items()}}


def bucket_for(span_s: float, target: int = 24) -> int:
    """The smallest round bucket (seconds) that splits ``span_s`` into at most ``target`` buckets."""
    for b in _BUCKETS_S:
        if span_s / b <= target:
            return b
    return _BUCKETS_S[-1]


def iso(seconds: int) -> str:
    return dt.datetime.fromtimestamp(int(seconds), dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


# --- the queries ----------------------------------------------------------------------------------------------

SQL_SPAN_RANGE = "SELECT toUnixTimestamp(min(Timestamp)), toUnixTimestamp(max(Timestamp)), count() FROM spans"
SQL_REWARD_BY_VERSION = """
SELECT resources_id, count() AS rewards, uniqExact(rollout_id) AS rollouts, avg(reward) AS mean_reward,
       quantileExact(0.5)(reward) AS median_reward, min(reward) AS min_reward, max(reward) AS max_reward
FROM spans FINAL WHERE reward IS NOT NULL GROUP BY resources_id"""
# Training and validation apart: the rollout's mode is in its RolloutEnqueued event.
SQL_REWARD_BY_VERSION_MODE = """
SELECT s.resources_id AS resources_id, if(e.mode = '', 'unset', e.mode) AS mode,
       uniqExact(s.rollout_id) AS rollouts, avg(s.reward) AS mean_reward
FROM (SELECT rollout_id, resources_id, reward FROM spans FINAL WHERE reward IS NOT NULL) AS s
LEFT JOIN (SELECT rollout_id, any(mode) AS mode FROM rollout_events FINAL WHERE event_type = 'RolloutEnqueued'
           GROUP BY rollout_id) AS e ON s.rollout_id = e.rollout_id
GROUP BY resources_id, mode"""
SQL_REWARD_OVER_TIME = """
SELECT toUnixTimestamp(toStartOfInterval(toDateTime(Timestamp), INTERVAL {bucket} SECOND)) AS bucket,
       resources_id, count() AS rewards, avg(reward) AS mean_reward
FROM spans FINAL WHERE reward IS NOT NULL GROUP BY bucket, resources_id ORDER BY bucket, resources_id"""
SQL_LATENCY = """
SELECT SpanName, model, count() AS spans, quantilesExactInclusive(0.5, 0.95)(Duration) AS q,
       q[1] / 1e6 AS p50_ms, q[2] / 1e6 AS p95_ms, max(Duration) / 1e6 AS max_ms,
       countIf(StatusCode = 'Error') / count() AS error_rate
FROM spans FINAL GROUP BY SpanName, model ORDER BY spans DESC, SpanName, model LIMIT {limit}"""
SQL_TOKENS = """
SELECT model, count() AS llm_spans, sum(input_tokens) AS input_sum, sum(output_tokens) AS output_sum,
       avg(input_tokens + output_tokens) AS tokens_per_span
FROM spans FINAL WHERE input_tokens + output_tokens > 0
GROUP BY model ORDER BY input_sum + output_sum DESC, model LIMIT {limit}"""
SQL_TOKENS_OVER_TIME = """
SELECT toUnixTimestamp(toStartOfInterval(toDateTime(Timestamp), INTERVAL {bucket} SECOND)) AS bucket,
       sum(input_tokens) AS input_sum, sum(output_tokens) AS output_sum
FROM spans FINAL WHERE input_tokens + output_tokens > 0 GROUP BY bucket ORDER BY bucket"""
SQL_ATTEMPTS = """
SELECT count() AS attempts, countIf(sequence_id > 1) AS retries, uniqExact(rollout_id) AS rollouts_with_attempts,
       uniqExactIf(rollout_id, sequence_id > 1) AS rollouts_retried
FROM (SELECT rollout_id, sequence_id FROM rollout_events FINAL WHERE sequence_id > 0
      GROUP BY rollout_id, sequence_id)"""
SQL_ROLLOUTS = "SELECT uniqExact(rollout_id) FROM rollout_events FINAL WHERE event_type = 'RolloutEnqueued'"
_OUTCOMES = f"""
SELECT rollout_id, attempt_id, argMin(status, kafka_offset) AS outcome, min(event_time) AS ended
FROM rollout_events FINAL
WHERE attempt_id != '' AND event_type IN ('AttemptStatusChanged', 'AttemptUpdated')
  AND status IN ({", ".join(f"'{s}'" for s in TERMINAL)})
GROUP BY rollout_id, attempt_id"""
SQL_OUTCOMES = f"SELECT outcome, count() FROM ({_OUTCOMES}) GROUP BY outcome"
SQL_OUTCOMES_OVER_TIME = f"""
SELECT toUnixTimestamp(toStartOfInterval(toDateTime(ended), INTERVAL {{bucket}} SECOND)) AS bucket, outcome,
       count() AS attempts
FROM ({_OUTCOMES}) GROUP BY bucket, outcome ORDER BY bucket, outcome"""

# name -> SQL, for the benchmark (one bucket and limit filled in).
QUERIES: dict[str, str] = {
    "reward_by_version": SQL_REWARD_BY_VERSION, "reward_by_version_mode": SQL_REWARD_BY_VERSION_MODE,
    "reward_over_time": SQL_REWARD_OVER_TIME,
    "latency": SQL_LATENCY, "tokens": SQL_TOKENS, "tokens_over_time": SQL_TOKENS_OVER_TIME,
    "attempts": SQL_ATTEMPTS, "rollouts": SQL_ROLLOUTS, "outcomes": SQL_OUTCOMES,
    "outcomes_over_time": SQL_OUTCOMES_OVER_TIME,
}


def fill(sql: str, bucket_s: int = 60, limit: int = 30) -> str:
    return sql.replace("{bucket}", str(int(bucket_s))).replace("{limit}", str(int(limit)))


# --- the report -----------------------------------------------------------------------------------------------


def build(run: Run, limit: int = 30) -> Report:
    """Run every query through ``run`` (a connection, or the chDB owner's API) and shape the sections."""
    lo, hi, n_spans = (run(SQL_SPAN_RANGE).rows or [[0, 0, 0]])[0]
    report = Report(bucket_s=bucket_for(float(hi) - float(lo)) if n_spans else 60)

    def q(sql: str) -> list[list[Any]]:
        return run(fill(sql, report.bucket_s, limit)).rows

    by_version = sorted(q(SQL_REWARD_BY_VERSION), key=lambda r: resources_order(str(r[0])))
    report.add(Section("reward_by_version", "Reward by resources version",
                       ["resources_id", "rewards", "rollouts", "mean", "median", "min", "max"], by_version,
                       "reward spans (agentlightning.annotation) per resources id; policy-vN in version order"))
    by_mode = sorted(q(SQL_REWARD_BY_VERSION_MODE), key=lambda r: (resources_order(str(r[0])), str(r[1])))
    report.add(Section("reward_by_version_mode", "Training and validation reward by version",
                       ["resources_id", "mode", "rollouts", "mean"], by_mode,
                       "mode of each rollout (train / val) from its RolloutEnqueued event"))
    over_time = [[iso(r[0]), *r[1:]] for r in q(SQL_REWARD_OVER_TIME)]
    report.add(Section("reward_over_time", f"Reward over time ({_bucket_label(report.bucket_s)} buckets, UTC)",
                       ["bucket", "resources_id", "rewards", "mean"], over_time))
    latency = [[r[0], r[1], r[2], r[4], r[5], r[6], r[7]] for r in q(SQL_LATENCY)]
    report.add(Section("latency", "Latency by span name and model",
                       ["span", "model", "spans", "p50_ms", "p95_ms", "max_ms", "error_rate"], latency,
                       f"top {limit} by span count; exact quantiles of Duration, interpolated as numpy does"))
    report.add(Section("tokens", "Token usage by model",
                       ["model", "llm_spans", "input_tokens", "output_tokens", "tokens_per_span"], q(SQL_TOKENS),
                       "spans with gen_ai.usage.* (input/output or prompt/completion)"))
    report.add(Section("tokens_over_time", f"Tokens over time ({_bucket_label(report.bucket_s)} buckets, UTC)",
                       ["bucket", "input_tokens", "output_tokens"],
                       [[iso(r[0]), *r[1:]] for r in q(SQL_TOKENS_OVER_TIME)]))
    report.add(_attempts_section(q))
    report.add(Section("outcomes_over_time", "Attempt outcomes over time", ["bucket", "outcome", "attempts"],
                       [[iso(r[0]), *r[1:]] for r in q(SQL_OUTCOMES_OVER_TIME)]))
    return report


def _attempts_section(q: Callable[[str], list[list[Any]]]) -> Section:
    attempts, retries, with_attempts, retried = (q(SQL_ATTEMPTS) or [[0, 0, 0, 0]])[0]
    rollouts = int((q(SQL_ROLLOUTS) or [[0]])[0][0])
    outcomes = {str(r[0]): int(r[1]) for r in q(SQL_OUTCOMES)}
    finished = sum(outcomes.values())

    def rate(n: int, d: int) -> float | None:
        return round(n / d, 4) if d else None

    rows: list[list[Any]] = [
        ["rollouts enqueued", rollouts, None],
        ["attempts started", int(attempts), None],
        ["retries (attempt number > 1)", int(retries), rate(int(retries), int(attempts))],
        ["rollouts retried", int(retried), rate(int(retried), int(with_attempts))],
        ["attempts with an outcome", finished, rate(finished, int(attempts))],
        *[[f"  {s}", outcomes.get(s, 0), rate(outcomes.get(s, 0), finished)] for s in TERMINAL],
    ]
    return Section("attempts", "Attempts: failure, retry and timeout rates", ["what", "count", "rate"], rows,
                   "from rollout_events; outcome rates are over attempts with an outcome, the retry rate over "
                   "attempts started, rollouts retried over rollouts with an attempt")


def _bucket_label(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


# --- the terminal ---------------------------------------------------------------------------------------------


def cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value) if value != "" else "(none)"


def render(console: Any, report: Report, max_rows: int = 40) -> None:
    """One rich table per section; an empty section says so in one line."""
    from rich.table import Table

    for s in report.sections.values():
        if not s.rows:
            console.print(f"[bold]{s.title}[/]: [dim]no data[/]")
            continue
        table = Table(title=s.title, title_justify="left", caption=s.note or None, caption_justify="left")
        for i, c in enumerate(s.columns):
            numeric = any(isinstance(r[i], (int, float)) for r in s.rows)
            table.add_column(c, justify="right" if numeric else "left")
        rows = s.rows if len(s.rows) <= max_rows else s.rows[-max_rows:]  # over time: the latest
        for r in rows:
            table.add_row(*(cell(v) for v in r))
        console.print(table)
