"""``litstream report``: the numbers of each section on known data, redeliveries not counted twice, the plots,
and the command line (directly on the chDB directory, and through the sink that owns it)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from litstream.app import plots, report
from litstream.app.stack import Stack, settings_env
from litstream.infra.clickhouse import ClickHouse
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.events import (
    AttemptStarted,
    AttemptStatusChanged,
    Event,
    EventFactory,
    RolloutEnqueued,
    SpanRecorded,
)
from litstream.schemas.policy_versions import resources_order
from litstream.streams.event_rows import Positioned, event_arrow
from litstream.streams.span_rows import span_arrow
from tests.samples import span

F = EventFactory(role="test")


def reward_span(rid: str, seq: int, reward: float, version: str) -> SpanRecorded:
    return span(seq, rollout_id=rid).model_copy(update={
        "name": "agentlightning.annotation", "resources_id": version,
        "attributes": {"agentlightning.reward.0.value": reward}})


def llm_span(rid: str, seq: int, ms: int, model: str, tokens: tuple[int, int]) -> SpanRecorded:
    s = span(seq, rollout_id=rid)
    return s.model_copy(update={"end_time_ns": s.start_time_ns + ms * 1_000_000, "attributes": {
        "gen_ai.request.model": model, "gen_ai.usage.input_tokens": tokens[0],
        "gen_ai.usage.output_tokens": tokens[1]}})


def spans() -> list[SpanRecorded]:
    out = []
    for i, (version, reward) in enumerate([("policy-v10", 0.9), ("policy-v2", 0.2), ("policy-v2", 0.4),
                                           ("", 0.0)]):
        out.append(reward_span(f"ro-r{i}", 1, reward, version))
    out += [llm_span("ro-l", seq, ms, "m1", (10, 5)) for seq, ms in zip(range(1, 21), range(1, 21))]
    out.append(llm_span("ro-l", 21, 7, "m2", (100, 50)))
    return out


def lifecycle() -> list[Event]:
    """r1: attempt 1 fails, attempt 2 times out, attempt 3 succeeds; r2: succeeds at once; r3: a claim that lost
    its race (same attempt number) and a late status after the outcome; r4: enqueued, never claimed."""
    now = time.time()
    ev: list[Event] = []

    def started(rid: str, aid: str, seq: int) -> None:
        ev.append(AttemptStarted(meta=F.meta(rid), attempt_id=aid, sequence_id=seq, start_time=now))

    def status(rid: str, aid: str, st: str) -> None:
        ev.append(AttemptStatusChanged(meta=F.meta(rid), attempt_id=aid, status=st, time=now))  # type: ignore[arg-type]

    for rid in ("r1", "r2", "r3", "r4"):
        ev.append(RolloutEnqueued(meta=F.meta(rid), input={}, start_time=now))
    for rid, aid, seq, outcome in (("r1", "a1", 1, "failed"), ("r1", "a2", 2, "timeout"),
                                   ("r1", "a3", 3, "succeeded"), ("r2", "b1", 1, "succeeded")):
        started(rid, aid, seq)
        status(rid, aid, outcome)
    started("r3", "c1", 1)
    started("r3", "c1-loser", 1)
    status("r3", "c1", "unresponsive")
    status("r3", "c1", "succeeded")  # late: the first outcome stands, as in the fold
    return ev


def fill(ch: ClickHouse) -> None:
    batch = spans()
    events = [Positioned(e, 0, i) for i, e in enumerate(lifecycle())]
    for _ in range(2):  # everything delivered twice: no section may count it twice
        ch.insert_arrow("spans", span_arrow(batch))
        ch.insert_arrow("rollout_events", event_arrow(events))


@pytest.fixture
def ch(tmp_path: Path) -> Iterator[ClickHouse]:
    c = ClickHouse(f"chdb://{tmp_path / 'chdb'}", role="test")
    c.migrate()
    fill(c)
    yield c
    c.close()


def test_sections_count_each_record_once(ch: ClickHouse) -> None:
    r = report.build(ch.query)
    s = r.sections
    assert [row[:3] for row in s["reward_by_version"].rows] == [["policy-v2", 2, 2], ["policy-v10", 1, 1],
                                                                ["", 1, 1]]
    assert s["reward_by_version"].rows[0][3] == pytest.approx(0.3)
    assert sum(row[2] for row in s["reward_over_time"].rows) == 4
    by_mode = s["reward_by_version_mode"].rows  # train and validation apart (these rollouts name no mode)
    assert sum(row[2] for row in by_mode) == sum(row[2] for row in s["reward_by_version"].rows)
    assert {row[1] for row in by_mode} == {"unset"}

    latency = {(row[0], row[1]): row for row in s["latency"].rows}
    chat = latency[("chat", "m1")]
    assert chat[2] == 20 and chat[3] == pytest.approx(10.5) and chat[4] == pytest.approx(19.05)
    assert chat[5] == pytest.approx(20.0) and chat[6] == 0

    tokens = {row[0]: row for row in s["tokens"].rows}
    assert tokens["m1"][1:4] == [20, 200, 100] and tokens["m2"][1:4] == [1, 100, 50]
    assert list(tokens) == ["m1", "m2"]  # by total tokens
    assert sum(row[1] + row[2] for row in s["tokens_over_time"].rows) == 450

    attempts = {row[0].strip(): row[1:] for row in s["attempts"].rows}
    assert attempts["rollouts enqueued"][0] == 4
    assert attempts["attempts started"][0] == 5  # r1: 3, r2: 1, r3: 1 (the losing claim is not an attempt)
    assert attempts["retries (attempt number > 1)"] == [2, 0.4]
    assert attempts["rollouts retried"] == [1, pytest.approx(1 / 3, abs=1e-4)]
    assert attempts["attempts with an outcome"][0] == 5
    assert attempts["failed"] == [1, 0.2] and attempts["timeout"] == [1, 0.2]
    assert attempts["unresponsive"] == [1, 0.2] and attempts["succeeded"] == [2, 0.4]
    assert sum(row[2] for row in s["outcomes_over_time"].rows) == 5


def test_empty_tables_give_an_empty_report(tmp_path: Path) -> None:
    c = ClickHouse(f"chdb://{tmp_path / 'chdb'}", role="test")
    try:
        c.migrate()
        r = report.build(c.query)
    finally:
        c.close()
    assert all(not s.rows for name, s in r.sections.items() if name != "attempts")
    assert plots.write(r, tmp_path / "plots") == [tmp_path / "plots" / "report.html"]


def test_plots_are_png_and_one_self_contained_page(ch: ClickHouse, tmp_path: Path) -> None:
    files = plots.write(report.build(ch.query), tmp_path / "out")
    names = {f.name for f in files}
    assert names == {"reward_by_version.png", "reward_by_version_mode.png", "reward_over_time.png", "latency.png", "tokens_over_time.png",
                     "outcomes_over_time.png", "report.html"}
    for f in files:
        if f.suffix == ".png":
            assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 6 and "policy-v10" in page and "src='http" not in page


def test_versions_sort_numerically() -> None:
    ids = ["policy-v10", "", "baseline", "policy-v2", "policy-v0"]
    assert sorted(ids, key=resources_order) == ["policy-v0", "policy-v2", "policy-v10", "baseline", ""]


def _cli(settings: Settings, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "litstream.app.cli", *args], check=True, capture_output=True,
                         text=True, timeout=300, env={**settings_env(settings), "PATH": "/usr/bin:/bin",
                                                      "COLUMNS": "200"})
    return out.stdout


def test_cli_report_on_the_directory_and_through_the_sink(settings: Settings, tmp_path: Path) -> None:
    c = ClickHouse(settings.resolved_clickhouse_dsn, role="test")
    c.migrate()
    fill(c)
    c.close()
    table = _cli(settings, "report", "--plot", str(tmp_path / "plots"))  # nobody owns the directory: opens it
    for title in ("Reward by resources version", "Latency by span name and model", "Token usage by model",
                  "Attempts: failure, retry and timeout rates"):
        assert title in table
    assert (tmp_path / "plots" / "report.html").exists()

    with Stack(settings) as stack:  # the sink owns it now: the report goes through its API
        stack.start("span-sink", "process", "span-sink")
        stack.wait_ready("span-sink", "span-sink", key="inserted")
        events = EventProducer(settings, role="test")
        events.send(events.topics.spans, reward_span("ro-new", 1, 1.0, "policy-v11"))
        events.flush()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait for the sink to store the new span
            doc = json.loads(_cli(settings, "report", "--json"))
            rows = doc["sections"]["reward_by_version"]["rows"]
            if any(row[0] == "policy-v11" for row in rows):
                break
            time.sleep(0.5)
    assert [row[0] for row in rows] == ["policy-v2", "policy-v10", "policy-v11", ""]
    csv = _cli(settings, "sql", "SELECT resources_id, count() FROM spans FINAL WHERE reward IS NOT NULL "
                                "GROUP BY resources_id ORDER BY resources_id", "--format", "csv")
    assert csv.splitlines()[0] == "resources_id,count()" and "policy-v11,1" in csv


def test_report_queries_benchmark_quick(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "--only", "report_queries", "--quick", "--no-agl",
                           "--results-dir", str(tmp_path)], check=False, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])  # bench runs from the checkout's root
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(next(tmp_path.glob("report_queries-*.json")).read_text())
    rows = {row["what"]: row for row in doc["rows"]}
    assert rows["query report.build (all sections)"]["msgs_per_s"] > 0
    assert rows["Arrow insert into chDB (spans, batches of 50k)"]["n"] == 100_000
    assert "no SQL store" in rows["agentlightning 0.3.0: report queries"]["note"]


def test_plots_read_at_a_glance(ch: ClickHouse) -> None:
    """Time axes in elapsed time (no mm:ss.micro tick labels), latency on a log scale, every legend off the data."""
    r = report.build(ch.query)
    for name, make in plots.PLOTS.items():
        fig = make(r.sections[name])
        assert fig is not None, name
        fig.canvas.draw()
        ax = fig.axes[0]
        legend = ax.get_legend()
        assert legend is not None and legend.get_window_extent().x0 >= ax.get_window_extent().x1, name
        if name.endswith("over_time"):
            assert ax.get_xlabel().startswith("elapsed since") and ax.get_xlabel().endswith("UTC (s)")
            assert not any(":" in t.get_text() for t in ax.get_xticklabels()), name
        plots.plt.close(fig)
    fig = plots.latency(r.sections["latency"])
    assert fig is not None and fig.axes[0].get_xscale() == "log"
    plots.plt.close(fig)
