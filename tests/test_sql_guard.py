"""The statement check of a person's SQL: one read statement, whatever the comments, quotes and case."""

from __future__ import annotations

import pytest

from litstream.infra.clickhouse.guard import QueryLimits, UnsafeQueryError, check_read_only, explain_error

ALLOWED = ["SELECT 1", "select count() from spans final", "  WITH x AS (SELECT 1) SELECT * FROM x  ;  ",
           "(SELECT 1) UNION ALL (SELECT 2)", "SHOW TABLES", "DESCRIBE spans", "desc spans", "EXPLAIN SELECT 1",
           "EXISTS TABLE spans", "-- a comment; with a semicolon\nSELECT 1", "/* DROP TABLE x; */ SELECT 1",
           "SELECT 'a;b', \"c;d\", `e;f`", "SELECT 'it''s; DROP TABLE spans'", "SELECT 'x\\'; DROP TABLE y'",
           "SELECT 'INTO OUTFILE' AS s"]
REFUSED = {
    "INSERT INTO spans VALUES (1)": "INSERT is not allowed",
    "alter table spans delete where 1": "ALTER is not allowed",
    "DROP TABLE spans": "DROP is not allowed",
    "SET readonly = 0": "SET is not allowed",
    "SYSTEM STOP MERGES": "SYSTEM is not allowed",
    "TRUNCATE TABLE spans": "TRUNCATE is not allowed",
    "KILL QUERY WHERE 1": "KILL is not allowed",
    "OPTIMIZE TABLE spans FINAL": "OPTIMIZE is not allowed",
    "SELECT 1; DROP TABLE spans": "2 statements given",
    "SELECT 1; SELECT 2": "2 statements given",
    "": "empty",
    "  ;  -- nothing\n": "empty",
    "SELECT 'unterminated": "unterminated",
    "SELECT 1 /* open": "unterminated",
    "SELECT 1 INTO OUTFILE '/tmp/x'": "INTO OUTFILE",
    "SELECT * FROM python('df')": "python",
}


@pytest.mark.parametrize("sql", ALLOWED)
def test_read_statements_pass(sql: str) -> None:
    assert check_read_only(sql)


@pytest.mark.parametrize("sql,reason", list(REFUSED.items()))
def test_anything_else_is_refused_with_the_reason(sql: str, reason: str) -> None:
    with pytest.raises(UnsafeQueryError, match=reason):
        check_read_only(sql)


def test_the_statement_sent_has_no_trailing_semicolon() -> None:
    assert check_read_only("SELECT 1;") == "SELECT 1"


def test_engine_errors_say_which_limit_and_what_to_do() -> None:
    limits = QueryLimits(max_seconds=5, max_memory_bytes=64 << 20, max_result_rows=1000)
    assert "time limit of 5 s" in explain_error("Code: 159. DB::Exception: Timeout exceeded (TIMEOUT_EXCEEDED)",
                                                limits)
    assert "more than 1,000 rows" in explain_error("Code: 396. (TOO_MANY_ROWS_OR_BYTES)", limits)
    assert "64 MB" in explain_error("Code: 241. (MEMORY_LIMIT_EXCEEDED)", limits)
    assert explain_error("Code: 62. Syntax error", limits) == "Code: 62. Syntax error"


def test_readonly_is_the_last_setting() -> None:
    """readonly=1 forbids changing any setting after it, so the limits go first."""
    assert list(QueryLimits().settings())[-1] == "readonly"


def test_the_store_binds_every_value_of_a_spans_query() -> None:
    from litstream.streams.span_query import SpanQuery

    tricky = "ro-1' OR '1'='1"
    sql, parameters = SpanQuery.of(tricky, "at-1", "or", SpanName=("chat", "x'"), TraceId=(None, None)).sql()
    assert tricky not in sql and "x'" not in sql and "chat" not in sql  # values travel beside the statement
    assert parameters == {"rollout_id": tricky, "attempt_id": "at-1", "SpanName_is": "chat", "SpanName_has": "x'"}
    assert "(SpanName = {SpanName_is:String} OR position(SpanName, {SpanName_has:String}) > 0)" in sql


def test_a_span_stored_twice_is_read_once_as_its_newest_copy() -> None:
    """The spans query reads without FINAL: an unmerged second copy of a span comes back too, and the store keeps
    the copy FINAL would keep (the newest ``ingested_ns``), in sequence order."""
    from litstream.streams.span_query import newest_copies

    rows = [["a1", "at-1", 1, "s1", 10], ["b", "at-1", 2, "s2", 10], ["a2", "at-1", 1, "s1", 20],
            ["c", "at-2", 1, "s1", 5]]
    assert sorted(newest_copies(rows)) == ["a2", "b", "c"]
