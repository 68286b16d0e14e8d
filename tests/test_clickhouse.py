"""Spans in ClickHouse (chDB): the table, the sink's batches, deduplication, and the one-owner rule."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from litstream.infra.clickhouse import ChdbLockedError, ClickHouse, query
from litstream.streams.span_rows import SPAN_COLUMNS, span_columns
from tests.samples import span


@pytest.fixture
def ch(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = ClickHouse(f"chdb://{tmp_path / 'chdb'}", role="test")
    c.migrate()
    yield c
    c.close()


def test_spans_land_with_otel_columns_and_rollout_columns(ch: ClickHouse) -> None:
    spans = [span(i) for i in range(1, 6)]
    ch.insert("spans", SPAN_COLUMNS, span_columns(spans))
    res = ch.query("SELECT rollout_id, attempt_id, sequence_id, SpanName, SpanKind, StatusCode, ServiceName, "
                   "SpanAttributes['n'], SpanAttributes['ok'], Duration, length(Events.Name) "
                   "FROM spans ORDER BY sequence_id")
    assert len(res.rows) == 5
    assert res.rows[0] == ["ro-000000000001", "at-00000001", 1, "chat", "Client", "Ok", "svc", "3", "true", 1000, 1]


def test_redelivered_spans_do_not_show_twice(ch: ClickHouse) -> None:
    batch = span_columns([span(i) for i in range(1, 4)])
    ch.insert("spans", SPAN_COLUMNS, batch)
    ch.insert("spans", SPAN_COLUMNS, batch)  # the same batch again, as after a crash before the commit
    assert ch.query("SELECT count() FROM spans FINAL").rows[0][0] == 3


def test_queries_are_read_only(ch: ClickHouse) -> None:
    with pytest.raises(Exception, match="(?i)readonly"):
        ch.query("DROP TABLE spans")


def test_reward_is_materialised(ch: ClickHouse) -> None:
    s = span(1).model_copy(update={"name": "agentlightning.annotation",
                                   "attributes": {"agentlightning.reward.0.value": 0.75}})
    ch.insert("spans", SPAN_COLUMNS, span_columns([s, span(2)]))
    assert ch.query("SELECT sum(reward), count(reward) FROM spans").rows[0] == [0.75, 1]


def test_second_opener_is_told_who_owns_the_directory(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'chdb'}"
    owner = ClickHouse(dsn, role="span-sink")
    try:
        code = textwrap.dedent(f"""
            from litstream.infra.clickhouse import ClickHouse, ChdbLockedError
            try:
                ClickHouse({dsn!r}, role="intruder")
            except ChdbLockedError as exc:
                print(exc)
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
        assert "span-sink" in out and "pid" in out and "one process per directory" in out
    finally:
        owner.close()


def test_query_without_an_owner_opens_directly(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'chdb'}"
    c = ClickHouse(dsn, role="writer")
    c.migrate()
    c.close()
    assert query(dsn, "SELECT count() FROM spans").rows == [[0]]


def test_owner_without_api_gives_a_clear_error(tmp_path: Path) -> None:
    from litstream.infra.clickhouse import write_owner

    path = tmp_path / "chdb"
    # A live process (this test's parent, pytest's own pid is ours) cannot be used: simulate another live pid.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import json

        path.mkdir()
        write_owner(path, "span-sink", None)
        data = json.loads((path / "litstream.owner.json").read_text())
        data["pid"] = proc.pid
        (path / "litstream.owner.json").write_text(json.dumps(data))
        with pytest.raises(ChdbLockedError, match="span-sink"):
            query(f"chdb://{path}", "SELECT 1")
    finally:
        proc.kill()


def test_migrations_apply_once(tmp_path: Path) -> None:
    c = ClickHouse(f"chdb://{tmp_path / 'chdb'}", role="test")
    try:
        assert c.migrate() == ["0001_spans"]
        assert c.migrate() == []  # a restart applies nothing twice
        assert c.query("SELECT version, name FROM litstream_migrations FINAL").rows == [[1, "0001_spans"]]
    finally:
        c.close()
