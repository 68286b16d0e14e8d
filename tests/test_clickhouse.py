"""ClickHouse: the tables, Arrow inserts, deduplication, and the one-owner rule of chDB.

Every test that does not depend on chDB's single-opener rule runs against chDB and, when CLICKHOUSE_URL is set
(``http://user:password@host:8123``), against that server too, each test in a database of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from litstream.infra import clickhouse
from litstream.infra.clickhouse import (
    ChdbLockedError,
    ClickHouse,
    NoOwnerError,
    QueryError,
    QueryLimits,
    UnsafeQueryError,
    query,
    write_owner,
)
from litstream.infra.clickhouse.resident import file_mappings
from litstream.schemas.events import Event, TrainedSample, TripletEmitted, VersionTrained
from litstream.streams.event_rows import (
    LIFECYCLE_TYPES,
    Positioned,
    event_arrow,
    lineage_arrow,
    triplet_arrow,
)
from litstream.streams.span_rows import SPAN_COLUMNS, span_arrow, span_columns
from tests.samples import RID, F, all_records, span

MIGRATIONS = ["0001_spans", "0002_spans_genai_columns", "0003_rollout_events", "0004_triplets",
              "0005_spans_ttl_from_ingest", "0006_tool_calls_view", "0007_tool_usage_view",
              "0008_tool_call_errors_view", "0009_attempt_tool_use_view", "0010_trained_on", "0011_version_data_view",
              "0012_triplet_versions_view", "0013_llm_call_versions_view", "0014_spans_run_id",
              "0015_rollout_events_run_id", "0016_triplets_run_id", "0017_rollouts"]


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))


@pytest.fixture(params=["chdb", "server"])
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "chdb":
        yield f"chdb://{tmp_path / 'chdb'}"
        return
    url = os.environ.get("CLICKHOUSE_URL")
    if not url:
        pytest.skip("CLICKHOUSE_URL is not set")
    import clickhouse_connect

    database = f"litstream_test_{uuid.uuid4().hex[:12]}"
    admin = clickhouse_connect.get_client(dsn=url)
    admin.command(f"CREATE DATABASE {database}")
    try:
        yield _with_database(url, database)
    finally:
        admin.command(f"DROP DATABASE IF EXISTS {database}")
        admin.close()


@pytest.fixture
def ch(dsn: str) -> Iterator[ClickHouse]:
    c = ClickHouse(dsn, role="test")
    c.migrate()
    yield c
    c.close()


def test_spans_land_with_otel_columns_and_rollout_columns(ch: ClickHouse) -> None:
    ch.insert_arrow("spans", span_arrow([span(i) for i in range(1, 6)]))
    res = ch.query("SELECT rollout_id, attempt_id, sequence_id, SpanName, SpanKind, StatusCode, ServiceName, "
                   "SpanAttributes['n'], SpanAttributes['ok'], Duration, length(Events.Name), model "
                   "FROM spans FINAL ORDER BY sequence_id")
    assert len(res.rows) == 5
    assert res.rows[0] == ["ro-000000000001", "at-00000001", 1, "chat", "Client", "Ok", "svc", "3", "true", 1000, 1,
                           "m"]


def test_the_engine_answers_after_its_start_up_pages_are_dropped(ch: ClickHouse) -> None:
    ch.release_startup_pages()  # the pages come back from the page cache as the engine runs them
    ch.insert_arrow("spans", span_arrow([span(1), span(2)]))
    assert ch.query("SELECT count() FROM spans FINAL").rows == [[2]]


def test_only_unchanged_read_only_library_mappings_are_dropped() -> None:
    smaps = ("7f00-7f10 r--p 00000000 08:01 11 /venv/site-packages/chdb/_chdb.abi3.so\nRss: 8 kB\nAnonymous: 0 kB\n"
             "7f10-7f30 r-xp 00010000 08:01 11 /venv/site-packages/chdb/_chdb.abi3.so\nAnonymous: 0 kB\n"
             "7f30-7f38 r--p 00030000 08:01 11 /venv/site-packages/chdb/_chdb.abi3.so\nAnonymous: 32 kB\n"
             "7f38-7f40 rw-p 00038000 08:01 11 /venv/site-packages/chdb/_chdb.abi3.so\nAnonymous: 0 kB\n"
             "7f40-7f50 rw-p 00000000 00:00 0 \nAnonymous: 64 kB\n"
             "7f50-7f60 r-xp 00000000 08:01 12 /usr/lib/libc.so.6\nAnonymous: 0 kB\nVmFlags: rd ex\n")
    found = file_mappings(smaps, "/chdb")
    assert [(m.start, m.end) for m in found] == [(0x7F00, 0x7F10), (0x7F10, 0x7F30), (0x7F30, 0x7F38), (0x7F38, 0x7F40)]
    # relocated (private copies) and writable mappings keep their pages: dropping them would lose the changes
    assert [m.droppable for m in found] == [True, True, False, False]


def test_arrow_keeps_nanoseconds_maps_and_nested_columns(ch: ClickHouse) -> None:
    s = span(1)
    ch.insert_arrow("spans", span_arrow([s]))
    row = ch.query("SELECT toUnixTimestamp64Nano(Timestamp), arrayMap(t -> toUnixTimestamp64Nano(t), "
                   "Events.Timestamp), Events.Name, Events.Attributes, Links.TraceId, Links.SpanId, "
                   "Links.Attributes, ResourceAttributes, SpanAttributes FROM spans").rows[0]
    assert row[0] == s.start_time_ns  # exact to the nanosecond
    assert row[1] == [s.events[0].timestamp_ns]
    assert row[2:5] == [["e"], [{"k": "v"}], ["cd" * 16]]
    assert row[5:7] == [["ef" * 8], [{}]]
    assert row[7] == {"service.name": "svc"}
    assert row[8] == {"gen_ai.request.model": "m", "n": "3", "x": "0.5", "ok": "true", "list": "[1, 2]", "none": ""}


def test_arrow_and_plain_inserts_store_the_same_rows(ch: ClickHouse) -> None:
    spans = [span(i) for i in range(1, 4)]
    cols = [c for c in SPAN_COLUMNS if c != "ingested_ns"]
    ch.insert("spans", SPAN_COLUMNS, span_columns(spans))
    plain = ch.query(f"SELECT {', '.join(cols)} FROM spans ORDER BY sequence_id").rows
    ch.client.command("TRUNCATE TABLE spans")
    ch.insert_arrow("spans", span_arrow(spans))
    assert ch.query(f"SELECT {', '.join(cols)} FROM spans ORDER BY sequence_id").rows == plain


def test_a_span_older_than_the_retention_is_kept_since_retention_counts_from_ingest(ch: ClickHouse) -> None:
    """ClickHouse applies a table's TTL at insert: on the span's start time, an old span was dropped after the API
    had accepted it. Retention now counts from ingest, so a span of 2001 (far past the TTL) is stored."""
    old_ns = 1_000_000_000 * 1_000_000_000  # 2001-09-09, years past SPAN_TTL_DAYS
    old = span(1).model_copy(update={"start_time_ns": old_ns, "end_time_ns": old_ns + 1000})
    recent = span(2)
    ch.insert_arrow("spans", span_arrow([old, recent]))
    ch.command("OPTIMIZE TABLE spans FINAL")  # a merge applies the TTL again: the old span must survive it too
    rows = ch.query("SELECT sequence_id, toUnixTimestamp64Nano(Timestamp) FROM spans FINAL ORDER BY sequence_id").rows
    assert rows == [[1, old_ns], [2, recent.start_time_ns]]
    ttl = ch.query("SELECT engine_full FROM system.tables WHERE name = 'spans' AND database = currentDatabase()")
    assert "ingested_ns" in ttl.rows[0][0]


def test_redelivered_spans_do_not_show_twice(ch: ClickHouse) -> None:
    spans = [span(i) for i in range(1, 4)]
    ch.insert_arrow("spans", span_arrow(spans))
    ch.insert_arrow("spans", span_arrow(spans))  # the same batch again, as after a crash before the commit
    assert ch.query("SELECT count() FROM spans FINAL").rows[0][0] == 3


def test_reward_and_token_columns_are_materialised(ch: ClickHouse) -> None:
    reward = span(1).model_copy(update={"name": "agentlightning.annotation",
                                        "attributes": {"agentlightning.reward.0.value": 0.75}})
    old_spelling = span(3).model_copy(update={"attributes": {"gen_ai.response.model": "r",
                                                             "gen_ai.usage.prompt_tokens": 7,
                                                             "gen_ai.usage.completion_tokens": 2}})
    new_spelling = span(4).model_copy(update={"attributes": {"gen_ai.request.model": "q",
                                                             "gen_ai.usage.input_tokens": 5,
                                                             "gen_ai.usage.output_tokens": 1}})
    ch.insert_arrow("spans", span_arrow([reward, span(2), old_spelling, new_spelling]))
    assert ch.query("SELECT sum(reward), count(reward) FROM spans").rows[0] == [0.75, 1]
    assert ch.query("SELECT sequence_id, model, input_tokens, output_tokens FROM spans WHERE sequence_id > 2 "
                    "ORDER BY sequence_id").rows == [[3, "r", 7, 2], [4, "q", 5, 1]]


def _lifecycle_events() -> list[Event]:
    return [r for r in all_records() if isinstance(r, LIFECYCLE_TYPES)]


def test_every_lifecycle_event_type_lands_in_rollout_events(ch: ClickHouse) -> None:
    events = _lifecycle_events()
    assert {type(e) for e in events} == set(LIFECYCLE_TYPES)
    positioned = [Positioned(e, 1, offset) for offset, e in enumerate(events)]
    ch.insert_arrow("rollout_events", event_arrow(positioned))
    ch.insert_arrow("rollout_events", event_arrow(positioned))  # redelivered: collapses by event id
    rows = ch.query("SELECT event_type, rollout_id, attempt_id, sequence_id, status, error, event_id, "
                    "toUnixTimestamp64Nano(timestamp), kafka_offset, raw_json FROM rollout_events FINAL "
                    "ORDER BY kafka_offset").rows
    assert len(rows) == len(events)
    by_type = {r[0]: r for r in rows}
    assert by_type["AttemptStarted"][2:5] == ["at-1", 1, ""]
    assert by_type["AttemptStatusChanged"][2:6] == ["at-1", 0, "failed", "boom"]
    assert by_type["RolloutStatusChanged"][4:6] == ["cancelled", "user"]
    for r, e in zip(rows, events):
        assert (r[1], r[6], r[7]) == (RID, e.meta.event_id, e.meta.timestamp_ns)
        assert json.loads(r[9]) == json.loads(e.model_dump_json())


def test_triplets_collapse_by_rollout_attempt_and_index(ch: ClickHouse) -> None:
    def triplet(index: int, reward: float) -> TripletEmitted:
        return TripletEmitted(meta=F.meta(RID), attempt_id="at-1", group_id="g", index=index, policy_version="3",
                              resources_id="policy-v3", prompt_token_ids=[1, 2], response_token_ids=[3],
                              response_logprobs=[-0.25], prompt_text="p", response_text="r", reward=reward,
                              metadata={"k": 1})

    ch.insert_arrow("triplets", triplet_arrow([triplet(0, 0.0), triplet(1, 1.0)]))
    ch.insert_arrow("triplets", triplet_arrow([triplet(1, 0.5)]))  # emitted again: the later one stays
    rows = ch.query("SELECT `index`, reward, prompt_token_ids, response_token_ids, response_logprobs, "
                    "policy_version, resources_id, metadata_json FROM triplets FINAL ORDER BY `index`").rows
    assert rows == [[0, 0.0, [1, 2], [3], [-0.25], "3", "policy-v3", '{"k":1}'],
                    [1, 0.5, [1, 2], [3], [-0.25], "3", "policy-v3", '{"k":1}']]


def test_lineage_both_ways(ch: ClickHouse) -> None:
    """version_data: a version's triplets with the version that generated them; triplet_versions: each triplet's
    versions; llm_call_versions: the version that served each call. A version's record sent twice shows once."""
    def triplet(index: int, generated_by: str) -> TripletEmitted:
        return TripletEmitted(meta=F.meta(RID), attempt_id="at-1", group_id="g", index=index,
                              policy_version=generated_by, prompt_text=f"p{index}", response_text=f"r{index}",
                              reward=1.0)

    def trained(version: int, samples: list[TrainedSample]) -> VersionTrained:
        return VersionTrained(**F.stamp(), resources_id=f"policy-v{version}", version=version, time=1.0,
                              window="count", samples=samples)

    joined = TrainedSample(rollout_id=RID, attempt_id="at-1", group_id="g", index=0, turns=2, policy_version=2,
                           reward=1.0)  # one sample of two turns: triplets 0 and 1
    ch.insert_arrow("triplets", triplet_arrow([triplet(0, "2"), triplet(1, "2"), triplet(2, "policy-v4")]))
    ch.insert_arrow("trained_on", lineage_arrow([trained(3, [joined])]))
    ch.insert_arrow("trained_on", lineage_arrow([trained(3, [joined]), trained(5, [joined.model_copy(
        update={"index": 2, "turns": 1, "policy_version": 4})])]))  # v3 again: a restarted trainer
    rows = ch.query("SELECT version, `index`, generated_by, staleness, prompt_text FROM version_data "
                    "ORDER BY version, `index`").rows
    assert rows == [[3, 0, 2, 1, "p0"], [3, 1, 2, 1, "p1"], [5, 2, 4, 1, "p2"]]
    rows = ch.query("SELECT `index`, generated_by, trained_into FROM triplet_versions WHERE rollout_id = "
                    f"'{RID}' ORDER BY `index`").rows
    assert rows == [[0, 2, [3]], [1, 2, [3]], [2, 4, [5]]]
    served = span(7)
    served = served.model_copy(update={"attributes": {**served.attributes, "litstream.policy.version": 4}})
    ch.insert_arrow("spans", span_arrow([span(6), served]))
    assert ch.query("SELECT sequence_id, served_by FROM llm_call_versions").rows == [[7, 4]]


@pytest.mark.parametrize("sql", ["DROP TABLE spans", "INSERT INTO spans (SpanName) VALUES ('x')",
                                 "ALTER TABLE spans DELETE WHERE 1", "SET readonly = 0", "SYSTEM STOP MERGES",
                                 "SELECT 1; DROP TABLE spans", "SELECT 1 INTO OUTFILE '/tmp/litstream-x'"])
def test_user_queries_are_refused_and_the_writer_keeps_writing(ch: ClickHouse, sql: str) -> None:
    """A person's statement that would change anything is refused with the reason, and the session the sink
    writes with is untouched: it inserts right after (the old shared-session readonly stopped the sink here)."""
    with pytest.raises(UnsafeQueryError, match="not allowed|statements"):
        ch.user_query(sql)
    ch.insert_arrow("spans", span_arrow([span(1)]))
    assert ch.query("SELECT count() FROM spans FINAL").rows == [[1]]


def test_the_reader_session_itself_is_read_only(ch: ClickHouse) -> None:
    """Past the statement check, the engine refuses too: the reader session has readonly=1 for good."""
    reader = ch._reader()
    try:
        with pytest.raises(Exception, match="(?i)readonly"):
            reader.command("CREATE TABLE x (a UInt8) ENGINE = Memory")
    finally:
        ch._readers.put(reader)
    assert ch.user_query("SELECT count() FROM spans").rows == [[0]]
    ch.insert_arrow("spans", span_arrow([span(1)]))


def test_a_long_query_is_stopped_by_the_time_limit_while_inserts_go_on(dsn: str) -> None:
    c = ClickHouse(dsn, role="test", limits=QueryLimits(max_seconds=1.0))
    errors: list[Exception] = []

    def long_query() -> None:
        try:
            c.user_query("SELECT count() FROM numbers(100000000000) WHERE sipHash64(number) = 0")
        except QueryError as exc:
            errors.append(exc)

    try:
        c.migrate()
        thread = threading.Thread(target=long_query)
        thread.start()
        c.insert_arrow("spans", span_arrow([span(1)]))  # the writer's session is not the reader's: not blocked
        thread.join()
        assert len(errors) == 1 and "time limit of 1 s" in str(errors[0]) and "narrow it" in str(errors[0])
        assert c.user_query("SELECT count() FROM spans FINAL").rows == [[1]]
    finally:
        c.close()


def test_result_rows_are_limited(dsn: str) -> None:
    c = ClickHouse(dsn, role="test", limits=QueryLimits(max_result_rows=10))
    try:
        with pytest.raises(QueryError, match="more than 10 rows"):
            c.user_query("SELECT number FROM numbers(1000)")
        assert len(c.user_query("SELECT number FROM numbers(10)").rows) == 10
    finally:
        c.close()


def test_migrations_apply_once(dsn: str) -> None:
    c = ClickHouse(dsn, role="test")
    try:
        assert c.migrate() == MIGRATIONS
        assert c.migrate() == []  # a restart applies nothing twice
        assert c.query("SELECT name FROM litstream_migrations FINAL ORDER BY version").rows == [[m] for m in MIGRATIONS]
    finally:
        c.close()


# --- chDB only: one process per directory --------------------------------------------------------------------


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
        out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                             timeout=120).stdout
        assert "span-sink" in out and "pid" in out and "one process per directory" in out
    finally:
        owner.close()


def test_query_without_an_owner_opens_directly(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'chdb'}"
    c = ClickHouse(dsn, role="writer")
    c.migrate()
    c.close()
    assert query(dsn, "SELECT count() FROM spans").rows == [[0]]


def test_query_without_data_creates_nothing(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'chdb'}"
    with pytest.raises(NoOwnerError, match="no ClickHouse data"):
        query(dsn, "SELECT 1")
    assert not (tmp_path / "chdb").exists()


def test_a_reader_that_may_not_open_waits_for_the_owner_and_never_opens(tmp_path: Path) -> None:
    """Under a stack (the sink starting or restarting) a reader asks the owner or says so; it never opens the
    directory itself, which would take it from the sink."""
    dsn = f"chdb://{tmp_path / 'chdb'}"
    c = ClickHouse(dsn, role="writer")
    c.migrate()
    c.close()
    with pytest.raises(NoOwnerError, match="not serving"):
        query(dsn, "SELECT 1", may_open=False, wait_s=0.3)
    assert not (tmp_path / "chdb" / "litstream.owner.json").exists()


def test_owner_without_api_gives_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clickhouse, "OWNER_API_WAIT_S", 0.5)  # a starting owner that never serves: give up soon
    path = tmp_path / "chdb"
    # pytest's own pid is ours, so stand in another live process as the owner.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        path.mkdir()
        write_owner(path, "span-sink", None, serves_api=True)
        data = json.loads((path / "litstream.owner.json").read_text())
        data["pid"] = proc.pid
        (path / "litstream.owner.json").write_text(json.dumps(data))
        with pytest.raises(ChdbLockedError, match="span-sink"):
            query(f"chdb://{path}", "SELECT 1")
    finally:
        proc.kill()
        proc.wait()


def test_span_columns_from_records_equal_those_from_models() -> None:
    """The sink builds its columns from decoded Avro records, without models: the same values, raw_json too."""
    from litstream.schemas.codec import Codec
    from litstream.schemas.events import SpanRecorded
    from litstream.streams.span_rows import span_record_columns

    codec = Codec()
    spans = [span(i) for i in range(1, 4)]
    records = [codec.decode_record(codec.encode(s), SpanRecorded) for s in spans]
    assert span_record_columns(records, 7) == span_columns(spans, 7)
    assert span_record_columns(records, 7)[SPAN_COLUMNS.index("raw_json")] == [s.model_dump_json() for s in spans]


def test_an_empty_result_keeps_its_columns(ch: ClickHouse) -> None:
    res = ch.user_query("SELECT SpanName, count() AS n FROM spans FINAL GROUP BY SpanName")
    assert res.columns == ["SpanName", "n"] and res.rows == []


def test_values_are_bound_not_spliced_through_the_owner_api(tmp_path: Path) -> None:
    from litstream.infra.clickhouse import query_api
    from litstream.infra.clickhouse.api import serve_queries

    owner = ClickHouse(f"chdb://{tmp_path / 'chdb'}", role="owner")
    owner.migrate()
    server = serve_queries(owner)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        tricky = "x' OR 1=1 --\\"
        res = query_api(url, "SELECT {v:String} AS v, has({ids:Array(String)}, 'b') AS found",
                        parameters={"v": tricky, "ids": ["a", "b"]})
        assert res.rows == [[tricky, 1]]
    finally:
        server.shutdown()
        owner.close()
