"""ClickHouse through clickhouse-connect: chDB (``chdb:///dir``, embedded) or a server (``http://...``), same code.

chDB lets one process open a directory. That process (the span sink) is the *owner*: it writes an owner file
with its pid and query API, and every other process queries through that API (see :func:`query`).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import clickhouse_connect
import pyarrow as pa
from clickhouse_connect.driver.client import Client

from ..health import pid_alive
from .guard import QueryLimits, UnsafeQueryError, check_read_only, explain_error
from .resident import drop_clean_library_pages

__all__ = ["ChdbLockedError", "ClickHouse", "NoOwnerError", "QueryError", "QueryLimits", "QueryResult",
           "UnsafeQueryError", "check_read_only", "query", "reader", "user_sql"]

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
OWNER_FILE = "litstream.owner.json"
CHDB_CONFIG_FILE = "litstream.chdb.xml"  # the engine's own settings, written beside its data (chDB only)
# The span sink's memory (it owns the engine), measured with its inserts at the soak's rate (1,240 spans/s in 0.5 s
# batches) onto 300k stored spans: RSS p50 / p90 / max 595 / 679 / 866 MiB before, 471 / 498 / 633 MiB with the two
# settings below and the sink's Arrow pool (streams/span_sink.py), for the same CPU per span.
# chDB's jemalloc keeps freed pages 5 s (dirty_decay_ms:5000), up to ~100 MiB under steady inserts and merges; 1 s
# costs no CPU (0 s cost ~45% more). Read once, when chDB loads, under a name of its own (JE_).
CHDB_MALLOC_CONF = "dirty_decay_ms:1000"
# Merges made the peaks. Under 131,072 rows a merge was horizontal, every column of every part read at once; vertical
# goes column by column (p90 576 -> 487 MiB, engine peak 208 -> 128 MiB). Smaller merge blocks bound each column's
# share: merging the 300k spans took ~135 MiB of RSS instead of ~195. (64 KiB compression blocks saved ~10 MiB
# more and took 3x the disk: not taken.)
CHDB_MERGE_TREE = {"vertical_merge_algorithm_min_rows_to_activate": 1, "merge_max_block_size": 2048,
                   "merge_max_block_size_bytes": 2 << 20}
Parameters = dict[str, str | int | float | list[str]]  # values for a statement's {name:Type} placeholders
MAX_READERS = 4


class RunQuery(Protocol):
    """Runs a read-only statement, its ``{name:Type}`` placeholders filled from ``parameters``."""

    def __call__(self, sql: str, parameters: Parameters | None = None) -> QueryResult: ...  # user queries at once per owner (each on a reader session of its own)
SPAN_TTL_DAYS = 180


class ChdbLockedError(RuntimeError):
    """The chDB directory is open in another process."""


class NoOwnerError(RuntimeError):
    """No process serves the chDB directory and this one may not open it (a stack may own it), or there is no data."""


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.columns, "types": self.types, "rows": self.rows}


def chdb_dir(dsn: str) -> Path | None:
    """The directory of a ``chdb://`` DSN, or None for a server DSN."""
    if not dsn.startswith("chdb://"):
        return None
    path = dsn[len("chdb://"):].split("?", 1)[0]
    return Path(path).resolve() if path else None


def read_owner(path: Path) -> dict[str, Any] | None:
    try:
        owner: dict[str, Any] = json.loads((path / OWNER_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return owner if pid_alive(int(owner.get("pid", 0))) else None


def write_owner(path: Path, role: str, api_url: str | None, serves_api: bool = False) -> None:
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f".{OWNER_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"pid": os.getpid(), "role": role, "api_url": api_url,
                               "serves_api": serves_api or api_url is not None}))
    tmp.replace(path / OWNER_FILE)


def release_owner(path: Path) -> None:
    owner = read_owner(path)
    if owner is None or owner.get("pid") == os.getpid():
        (path / OWNER_FILE).unlink(missing_ok=True)


def _locked_message(path: Path, owner: dict[str, Any] | None) -> str:
    who = f"{owner.get('role')} (pid {owner.get('pid')}, API {owner.get('api_url')})" if owner else "another process"
    return (f"chDB directory {path} is open in {who}; chDB allows one process per directory. Query through "
            "the owner (`litstream sql` does), stop it, or point LITSTREAM_CLICKHOUSE_DSN elsewhere.")


class ClickHouse:
    """An open connection plus the lock that serialises its use across threads (the chDB client is not
    thread-safe)."""

    def __init__(self, dsn: str, role: str, serves_api: bool = False, limits: QueryLimits | None = None) -> None:
        """``serves_api``: this process will serve queries (:meth:`set_api`), so others wait for it to start.
        ``limits``: those of each user query (:meth:`user_query`)."""
        self.dsn = dsn
        self.role = role
        self.serves_api = serves_api
        self.limits = limits or QueryLimits()
        self.path = chdb_dir(dsn)
        self.lock = threading.RLock()
        # User queries run on reader sessions of their own (made on demand, reused), never on ``client``.
        self._readers: queue.LifoQueue[Client] = queue.LifoQueue()
        self._all_readers: list[Client] = []
        if self.path is not None:
            owner = read_owner(self.path)
            if owner is not None and owner.get("pid") != os.getpid():
                raise ChdbLockedError(_locked_message(self.path, owner))
            self.path.mkdir(parents=True, exist_ok=True)
            os.environ.setdefault("JE_MALLOC_CONF", CHDB_MALLOC_CONF)  # before chDB loads (a server: no effect)
            try:
                import chdb  # noqa: F401
            except ImportError:
                raise RuntimeError("a chdb:// DSN needs chDB: pip install 'litstream[local]', or set "
                                   "LITSTREAM_CLICKHOUSE_DSN=http://user:password@host:8123/db") from None
            # Claim before opening: a process that looks while this one opens sees a live owner and asks it,
            # rather than racing for the directory's lock.
            write_owner(self.path, role, None, serves_api)
        try:
            self.client: Client = self._connect()
        except Exception as exc:
            if self.path is None:
                raise
            release_owner(self.path)
            text = str(exc)
            if "lock" in text.lower() or "already initialized" in text or "EmbeddedServer" in text:
                raise ChdbLockedError(_locked_message(self.path, read_owner(self.path))) from None
            raise

    def _connect(self) -> Client:
        """A client on the DSN; on chDB with the engine settings (:data:`CHDB_MERGE_TREE`), which a server keeps
        in its own config."""
        if self.path is None:
            return clickhouse_connect.get_client(dsn=self.dsn)
        return clickhouse_connect.get_client(dsn=self.dsn, chdb_options={"config-file": str(chdb_config(self.path))})

    def set_api(self, api_url: str) -> None:
        if self.path is not None:
            write_owner(self.path, self.role, api_url)

    def migrate(self) -> list[str]:
        """Apply the migrations in ``migrations/`` not applied yet, in order; returns the names applied.

        Each file is one statement, numbered ``NNNN_name.sql``; ``{ttl_days}`` is filled in. Applied versions are
        recorded in ``litstream_migrations``, so a restart or a second process applies nothing twice.
        """
        applied: list[str] = []
        with self.lock:
            self.client.command(
                "CREATE TABLE IF NOT EXISTS litstream_migrations (version UInt32, name String, "
                "applied_at DateTime64(3) DEFAULT now64(3)) ENGINE = ReplacingMergeTree ORDER BY version")
            done = {int(r[0]) for r in self.client.query("SELECT version FROM litstream_migrations FINAL").result_rows}
            for path in sorted(MIGRATIONS_DIR.glob("[0-9][0-9][0-9][0-9]_*.sql")):
                version = int(path.name[:4])
                if version in done:
                    continue
                self.client.command(path.read_text().format(ttl_days=SPAN_TTL_DAYS))
                self.client.insert("litstream_migrations", [[version, path.stem]], column_names=["version", "name"])
                applied.append(path.stem)
        return applied

    def insert(self, table: str, columns: list[str], data: list[list[Any]]) -> None:
        with self.lock:
            self.client.insert(table, data, column_names=columns, column_oriented=True)

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """Insert an Arrow table (columns by name); the fast path: no per-value Python conversion."""
        with self.lock:
            self.client.insert_arrow(table, data)

    def command(self, sql: str) -> None:
        with self.lock:
            self.client.command(sql)

    def query(self, sql: str) -> QueryResult:
        """The project's own SQL, on the writing session; user SQL goes to :meth:`user_query`."""
        with self.lock:
            res = self.client.query(sql)
        return _result(res)

    def user_query(self, sql: str, parameters: Parameters | None = None) -> QueryResult:
        """A person's SQL: one read statement (else :class:`UnsafeQueryError`), run on a reader session with
        ``readonly=1`` and the limits; an engine error comes back as :class:`QueryError` saying what to do.
        ``parameters`` fill the statement's ``{name:Type}`` placeholders: values are bound, never spliced in."""
        statement = check_read_only(sql)
        client = self._reader()
        settings = None if self.path is not None else self.limits.settings()
        try:
            out = _result(client.query(statement, parameters=parameters, settings=settings))
            if not out.columns and statement.lstrip("( \n\t").upper().startswith(("SELECT", "WITH")):
                # No rows: chDB sends no block, so no column names either; ask for them (a CSV keeps its header).
                described = client.query(f"DESCRIBE ({statement})", parameters=parameters,
                                         settings=settings).result_rows
                out = QueryResult([str(r[0]) for r in described], [str(r[1]) for r in described], [])
        except Exception as exc:  # noqa: BLE001 (the engine's refusal, said plainly)
            raise QueryError(explain_error(str(exc), self.limits)) from None
        finally:
            self._readers.put(client)
        return out

    def _reader(self) -> Client:
        """A free reader session; a new one while there are fewer than MAX_READERS, else wait for one."""
        try:
            return self._readers.get_nowait()
        except queue.Empty:
            pass
        with self.lock:
            full = len(self._all_readers) >= MAX_READERS
        if full:  # each query ends within its time limit, so a reader frees up
            try:
                return self._readers.get(timeout=self.limits.max_seconds + 30)
            except queue.Empty:
                raise QueryError(f"{MAX_READERS} queries are running; try again when one has finished") from None
        client = self._connect()
        if self.path is not None:  # chDB: one more handle on the engine, its session read-only for good
            for name, value in self.limits.settings().items():
                client.command(f"SET {name} = '{value}'")
        with self.lock:
            self._all_readers.append(client)
        return client

    def release_startup_pages(self) -> None:
        """chDB only: drop the engine code only its start-up ran from this process's memory (:mod:`.resident`)."""
        if self.path is not None:
            with self.lock:
                drop_clean_library_pages(f"{os.sep}chdb")

    def close(self) -> None:
        with self.lock:
            for client in self._all_readers:
                client.close()
            self.client.close()
        if self.path is not None:
            release_owner(self.path)


def chdb_config(path: Path) -> Path:
    """Write the engine's config file (:data:`CHDB_MERGE_TREE`) into a chDB directory; returns its path."""
    settings = "".join(f"<{name}>{value}</{name}>" for name, value in CHDB_MERGE_TREE.items())
    target = path / CHDB_CONFIG_FILE
    tmp = path / f".{CHDB_CONFIG_FILE}.{os.getpid()}"
    tmp.write_text(f"<clickhouse><merge_tree>{settings}</merge_tree></clickhouse>\n")
    tmp.replace(target)
    return target


def _result(res: Any) -> QueryResult:
    return QueryResult(list(res.column_names), [t.name for t in res.column_types],
                       [list(r) for r in res.result_rows])


class QueryError(RuntimeError):
    """A query the engine refused or stopped (syntax, readonly, a limit); the message says why."""


def query(dsn: str, sql: str, timeout: float = 60.0, may_open: bool = True, wait_s: float | None = None,
          limits: QueryLimits | None = None, parameters: Parameters | None = None) -> QueryResult:
    """Run a person's read-only query from any process: through the chDB owner's API when one runs, else (only
    with ``may_open``, and only when the directory holds data) on a read-only session opened here. ``parameters``
    fill the statement's ``{name:Type}`` placeholders."""
    with reader(dsn, timeout, may_open, wait_s=wait_s, limits=limits) as run:
        return run(sql, parameters)


def user_sql(dsn: str, sql: str, timeout: float = 60.0, wait_s: float = 10.0,
             parameters: Parameters | None = None) -> QueryResult:
    """A person's SQL from a service (the gateway's ``POST /v1/sql``): checked (:class:`UnsafeQueryError`), then
    run by the owner of a chDB directory, never by opening it here (:class:`NoOwnerError` while none serves)."""
    return query(dsn, check_read_only(sql), timeout, may_open=False, wait_s=wait_s, parameters=parameters)


@contextmanager
def reader(dsn: str, timeout: float = 60.0, may_open: bool = True, wait_s: float | None = None,
           limits: QueryLimits | None = None) -> Iterator[RunQuery]:
    """A query function for several of a person's queries in a row: through the owner's API when one runs, else
    on one connection opened for the whole block (opening chDB costs more than a small query).

    ``may_open=False``: a stack may own the directory (starting, or restarting its sink), so wait for its owner
    up to ``wait_s`` and never open it here."""
    api = owner_api(dsn, wait_s=wait_s, wait_for_owner=not may_open)
    if api is not None:
        def through_owner(sql: str, parameters: Parameters | None = None) -> QueryResult:
            return query_api(api, check_read_only(sql), timeout, parameters)

        yield through_owner
        return
    path = chdb_dir(dsn)
    if path is not None and not (path / "metadata").exists():
        raise NoOwnerError(f"no ClickHouse data in {path} yet; start the stack with `litstream up` (nothing was "
                           "created here)")
    ch = ClickHouse(dsn, role="query", limits=limits)
    try:
        yield ch.user_query
    finally:
        ch.close()


OWNER_API_WAIT_S = 15.0  # how long a starting owner (directory claimed, API not up yet) is waited for


def owner_api(dsn: str, wait_s: float | None = None, wait_for_owner: bool = False) -> str | None:
    """The API of the live process that owns a chDB directory (not this one), or None when there is none (or
    the DSN is a server). An owner still starting is waited for; one that never serves is a ChdbLockedError.
    ``wait_for_owner``: no owner yet is waited for too (a stack's sink starting), and in the end a NoOwnerError."""
    path = chdb_dir(dsn)
    if path is None:
        return None
    deadline = time.monotonic() + (OWNER_API_WAIT_S if wait_s is None else wait_s)
    while True:
        owner = read_owner(path)
        if owner is None and wait_for_owner:
            if time.monotonic() >= deadline:
                raise NoOwnerError(f"the stack's span sink is not serving ClickHouse ({path}) yet: it is starting "
                                   "or restarting; try again in a few seconds (`litstream status` shows it)")
            time.sleep(0.1)
            continue
        if owner is None or owner.get("pid") == os.getpid():
            return None
        if owner.get("api_url"):
            return str(owner["api_url"])
        if not owner.get("serves_api") or time.monotonic() >= deadline:
            raise ChdbLockedError(_locked_message(path, owner))
        time.sleep(0.1)


def call_api(api_url: str, route: str, body: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """POST ``body`` to a route of the owner's API; its error comes back as :class:`QueryError`."""
    req = urllib.request.Request(api_url.rstrip("/") + route, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise QueryError(json.loads(exc.read() or b"{}").get("error", str(exc))) from None
    return out


def query_api(api_url: str, sql: str, timeout: float = 60.0, parameters: Parameters | None = None) -> QueryResult:
    body = call_api(api_url, "/sql", {"query": sql, **({"parameters": parameters} if parameters else {})}, timeout)
    return QueryResult(body["columns"], body["types"], body["rows"])
