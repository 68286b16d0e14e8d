"""What user SQL may do: one read-only statement, with limits per query.

Every query a person sends (``litstream sql``, ``POST /v1/sql``, ``litstream report``) passes
:func:`check_read_only` first, for a clear refusal, and then runs on a reader session of its own whose settings
are ``readonly=1`` plus the limits below (see ``ClickHouse.user_query``): the session the sink writes with is never
touched, and a statement the check missed is still refused by the engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..settings import Settings

READ_STATEMENTS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS")
# Allowed by ClickHouse's readonly mode, yet they act outside the query: writing a file, running Python (chDB).
FORBIDDEN = [(re.compile(r"\bINTO\s+OUTFILE\b", re.I), "INTO OUTFILE writes a file"),
             (re.compile(r"\bpython\s*\(", re.I), "the python() table function runs code")]


class UnsafeQueryError(ValueError):
    """The SQL is not one read-only statement; the message says why and what is allowed."""


@dataclass(frozen=True)
class QueryLimits:
    """Limits of one user query; past them ClickHouse stops it with an error naming the limit."""

    max_seconds: float = 30.0
    max_memory_bytes: int = 2 << 30
    max_result_rows: int = 100_000

    @classmethod
    def from_settings(cls, settings: Settings) -> QueryLimits:
        return cls(settings.sql_max_seconds, settings.sql_max_memory_mb << 20, settings.sql_max_rows)

    def settings(self) -> dict[str, str]:
        """As ClickHouse settings; ``readonly`` last, since it forbids changing any setting after it."""
        return {"max_execution_time": f"{self.max_seconds:g}", "max_memory_usage": str(self.max_memory_bytes),
                "max_result_rows": str(self.max_result_rows), "result_overflow_mode": "throw", "readonly": "1"}


def _skip_quoted(sql: str, i: int) -> int:
    """The index after the quoted literal or identifier starting at ``i`` (backslash and doubled quotes escape)."""
    quote, i = sql[i], i + 1
    while i < len(sql):
        if sql[i] == "\\":
            i += 2
        elif sql[i] == quote and sql[i + 1:i + 2] == quote:
            i += 2
        elif sql[i] == quote:
            return i + 1
        else:
            i += 1
    raise UnsafeQueryError(f"unterminated {quote} quote in the query")


def _skip_comment(sql: str, i: int) -> int | None:
    """The index after a comment starting at ``i``, or None when none starts there."""
    if sql.startswith("--", i) or sql[i] == "#":
        end = sql.find("\n", i)
        return len(sql) if end < 0 else end + 1
    if sql.startswith("/*", i):
        end = sql.find("*/", i + 2)
        if end < 0:
            raise UnsafeQueryError("unterminated /* comment in the query")
        return end + 2
    return None


def statements(sql: str) -> list[str]:
    """The statements of ``sql`` split on ``;`` outside quotes, comments blanked out, empty ones dropped."""
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(sql):
        ch = sql[i]
        if ch in "'\"`":
            end = _skip_quoted(sql, i)
            current.append(sql[i:end])
            i = end
            continue
        after_comment = _skip_comment(sql, i)
        if after_comment is not None:
            current.append(" ")
            i = after_comment
            continue
        if ch == ";":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _unquoted(statement: str) -> str:
    """The statement with its quoted literals emptied, so keywords inside strings do not count."""
    out: list[str] = []
    i = 0
    while i < len(statement):
        if statement[i] in "'\"`":
            end = _skip_quoted(statement, i)
            out.append("''")
            i = end
        else:
            out.append(statement[i])
            i += 1
    return "".join(out)


def check_read_only(sql: str) -> str:
    """The one read statement in ``sql`` (comments kept out, no trailing ``;``), or :class:`UnsafeQueryError`."""
    found = statements(sql)
    if not found:
        raise UnsafeQueryError("the query is empty; send one SELECT statement")
    if len(found) > 1:
        raise UnsafeQueryError(f"{len(found)} statements given; send one statement at a time (no ';' between)")
    statement = found[0]
    bare = _unquoted(statement)
    first = re.match(r"[\s(]*([A-Za-z]+)", bare)
    keyword = first.group(1).upper() if first else statement[:20]
    if keyword not in READ_STATEMENTS:
        raise UnsafeQueryError(f"{keyword} is not allowed: queries are read-only "
                               f"({', '.join(READ_STATEMENTS)} only)")
    for pattern, why in FORBIDDEN:
        if pattern.search(bare):
            raise UnsafeQueryError(f"not allowed in a read-only query: {why}")
    return statement


_LIMIT_ERRORS = [
    (("TIMEOUT_EXCEEDED", "Code: 159"), "the query ran past the time limit of {max_seconds:g} s "
     "(LITSTREAM_SQL_MAX_SECONDS) and was stopped; narrow it with WHERE or LIMIT"),
    (("TOO_MANY_ROWS", "Code: 396"), "the result has more than {max_result_rows:,} rows (LITSTREAM_SQL_MAX_ROWS); "
     "add a LIMIT or aggregate"),
    (("MEMORY_LIMIT_EXCEEDED", "Code: 241"), "the query needed more than {max_memory_mb:,} MB "
     "(LITSTREAM_SQL_MAX_MEMORY_MB) and was stopped; narrow it with WHERE or aggregate less"),
    (("(READONLY)", "Code: 164"), "queries are read-only and cannot change data or settings ({engine})"),
]


def explain_error(text: str, limits: QueryLimits) -> str:
    """The engine's error as one line saying what happened and what to do."""
    engine = text.strip().splitlines()[0][:2000] if text.strip() else "unknown error"
    for marks, message in _LIMIT_ERRORS:
        if any(m in text for m in marks):
            return message.format(max_seconds=limits.max_seconds, max_result_rows=limits.max_result_rows,
                                  max_memory_mb=limits.max_memory_bytes >> 20, engine=engine)
    return engine
