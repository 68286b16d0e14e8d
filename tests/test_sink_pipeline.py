"""The sink on a real broker and real chDB: all three topics land in their tables, garbage becomes dead letters,
a sink killed mid-stream (anywhere, and exactly between an insert and its commit) loses nothing and shows no
duplicate, and the tables rebuild from the topics."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from litstream.app.stack import Stack, settings_env
from litstream.infra import clickhouse, failpoints, health
from litstream.infra.kafka import headers_dict, producer, read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.events import AvroModel, TripletEmitted
from litstream.streams.event_rows import LIFECYCLE_TYPES
from litstream.streams.span_sink import SpanSink
from tests.samples import F, all_records, span
from tests.waiting import until as wait_for


def lifecycle(rollout_id: str) -> list[AvroModel]:
    out = []
    for r in all_records():
        if isinstance(r, LIFECYCLE_TYPES):
            out.append(r.model_copy(update={"meta": F.meta(rollout_id)}))
    return out


def triplet(rollout_id: str, index: int) -> TripletEmitted:
    return TripletEmitted(meta=F.meta(rollout_id), attempt_id="at-1", group_id="g", index=index,
                          resources_id="policy-v1", policy_version="1", prompt_token_ids=[1], reward=1.0)


def produce(settings: Settings, rollouts: int, spans_each: int) -> dict[str, int]:
    """Spans, every lifecycle event type, and triplets for ``rollouts`` rollouts; returns records per table."""
    events = EventProducer(settings, role="test")
    counts = {"spans": 0, "rollout_events": 0, "triplets": 0}
    for r in range(rollouts):
        rid = f"ro-{r:012d}"
        for seq in range(1, spans_each + 1):
            events.send(events.topics.spans, span(seq, rollout_id=rid))
        for e in lifecycle(rid):
            events.send(events.topics.rollout_events, e)
            counts["rollout_events"] += 1
        for i in range(2):
            events.send(events.topics.triplets, triplet(rid, i))
        counts["spans"] += spans_each
        counts["triplets"] += 2
    events.flush()
    return counts


def table_counts(settings: Settings) -> dict[str, int]:
    dsn = settings.resolved_clickhouse_dsn
    return {t: int(clickhouse.query(dsn, f"SELECT count() FROM {t} FINAL").rows[0][0])
            for t in ("spans", "rollout_events", "triplets")}


def test_all_three_topics_land_and_garbage_becomes_dead_letters(settings: Settings, sink: SpanSink) -> None:
    raw = producer(settings)
    for topic in (sink.topics.spans, sink.topics.triplets, sink.topics.rollout_events):
        raw.produce(topic, key=b"ro-garbage", value=b"not avro at all")
    raw.flush(10)
    produced = produce(settings, rollouts=3, spans_each=4)

    wait_for("every record stored", lambda: sink.stats["inserted"] >= produced["spans"]
             and sink.stats["events"] >= produced["rollout_events"] and sink.stats["triplets"] >= produced["triplets"]
             and sink.stats["undecodable"] >= 3)
    assert {t: int(sink.ch.query(f"SELECT count() FROM {t} FINAL").rows[0][0]) for t in produced} == produced
    types = {r[0] for r in sink.ch.query("SELECT DISTINCT event_type FROM rollout_events").rows}
    assert types == {cls.__name__ for cls in LIFECYCLE_TYPES}

    letters = wait_for("a spans dead letter", lambda: list(read_to_end(settings, sink.topics.dlq("spans"))))
    assert len(letters) == 1 and letters[0].value() == b"not avro at all"
    h = headers_dict(letters[0])
    assert h["litstream.dlq.processor"] == b"span-sink" and h["litstream.dlq.error_type"] == b"decode"
    # rollout-events and triplets have their dead letters from their main consumers; the sink only counts them.
    for role in ("rollout-events", "triplets"):
        assert list(read_to_end(settings, sink.topics.dlq(role))) == []
    assert sink.stats["dead_letters"] == 1


def _cli(settings: Settings, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "litstream.app.cli", *args], check=True, capture_output=True,
                         text=True, timeout=300, env={**settings_env(settings), "PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    return out.stdout


def test_a_killed_sink_loses_nothing_shows_no_duplicate_and_the_tables_rebuild(settings: Settings) -> None:
    with Stack(settings) as stack:
        stack.start("span-sink", "process", "span-sink")
        stack.wait_ready("span-sink", "span-sink", key="inserted")
        produced: dict[str, int] = {}
        producing = threading.Thread(target=lambda: produced.update(produce(settings, rollouts=40, spans_each=250)))
        producing.start()
        # Kill it as soon as it has stored something: mid-stream, between an insert and a commit or anywhere.
        wait_for("a first insert", lambda: bool((health.read(settings.data_dir, "span-sink") or {}).get("inserted")))
        stack.roles["span-sink"].proc.kill()
        stack.roles["span-sink"].proc.wait()
        producing.join()
        stack.start("span-sink", "process", "span-sink")
        stack.wait_ready("span-sink", "span-sink", key="inserted")
        wait_for("all records after the restart", lambda: table_counts(settings) == produced)

        # Through the owner (the sink holds the chDB directory): empty the tables and rebuild them from the topics.
        summary = json.loads(_cli(settings, "replay", "--sink", "clickhouse", "--truncate", "--json"))
        assert summary["where"].startswith("http://127.0.0.1:")
        for table, n in produced.items():
            assert summary["tables"][table]["read"] == n
            assert summary["tables"][table]["stored"] == n
            assert summary["tables"][table]["rows"] == n
        assert table_counts(settings) == produced
        stack.roles["span-sink"].stop()

    # Nobody owns the directory now: the rebuild opens it itself, and redelivers everything onto the same rows.
    summary = json.loads(_cli(settings, "replay", "--sink", "clickhouse", "--json"))
    assert summary["where"] == "this process"
    assert {t: summary["tables"][t]["rows"] for t in produced} == produced
    table = _cli(settings, "replay", "--sink", "clickhouse")
    assert "rebuilt from the topics" in table and "rollout_events" in table


IDENTITY = {"spans": "rollout_id, attempt_id, sequence_id, SpanId", "rollout_events": "rollout_id, event_id",
            "triplets": "rollout_id, attempt_id, `index`"}


def test_a_sink_dying_between_insert_and_commit_loses_nothing_and_shows_no_duplicate(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    produced = produce(settings, rollouts=8, spans_each=60)  # on the topics before the sink starts: one big batch
    monkeypatch.setenv(failpoints.ENV, "span-sink.after-insert")
    with Stack(settings) as stack:
        doomed = stack.start("span-sink", "process", "span-sink")
        assert doomed.proc.wait(120) == failpoints.EXIT_CODE  # the rows are in ClickHouse, no offset is committed
        assert doomed.log_path is not None and "failpoint span-sink.after-insert" in doomed.log_path.read_text()
        with clickhouse.reader(settings.resolved_clickhouse_dsn) as q:
            stored_once = {t: int(q(f"SELECT count() FROM {t}").rows[0][0]) for t in produced}
        assert sum(stored_once.values()) > 0

        monkeypatch.delenv(failpoints.ENV)
        stack.start("span-sink", "process", "span-sink")
        stack.wait_ready("span-sink", "span-sink", key="inserted")
        wait_for("all records after the restart", lambda: table_counts(settings) == produced)
        # Nothing had been committed, so the restarted sink read and inserted every record again, the dead batch's
        # included: those rows went in twice.
        beat = wait_for("the restarted sink's counts", lambda: (lambda h: h if h and h.get("inserted") ==
                        produced["spans"] else None)(health.read(settings.data_dir, "span-sink")))
        assert (beat["events"], beat["triplets"]) == (produced["rollout_events"], produced["triplets"])
        dsn = settings.resolved_clickhouse_dsn
        for table, n in produced.items():
            plain = int(clickhouse.query(dsn, f"SELECT count() FROM {table}").rows[0][0])
            distinct = int(clickhouse.query(dsn, f"SELECT count() FROM (SELECT DISTINCT {IDENTITY[table]} "
                                                 f"FROM {table})").rows[0][0])
            final = int(clickhouse.query(dsn, f"SELECT count() FROM {table} FINAL").rows[0][0])
            assert plain >= n  # a plain count may show the repeat until a merge collapses it ...
            assert distinct == final == n  # ... but no record is there twice, and none is missing
