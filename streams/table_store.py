"""The lifecycle table's local RocksDB copy, checked against its changelog before Faust opens it.

With ``table_store=rocksdb`` each table partition lives in ``<tabledir>/rollouts-<partition>.db`` with the
changelog offset it has read up to (Faust's "persisted offset"). Faust trusts that copy and reads the changelog
only past that offset. If the log was reset since (a fresh embedded broker, topics deleted and created again),
the copy's offset points past the changelog's end and Faust's recovery stops the worker with a ConsistencyError,
at every restart. So at startup a copy ahead of its changelog is removed (every partition: a reset log
invalidates them all) and the table is rebuilt from the changelog, as with the memory store. (A reset log that
has already grown past the old offset cannot be told apart this way: remove ``<data_dir>/faust`` when a log is
reset on purpose.)
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from litstream.infra.kafka import end_offsets
from litstream.infra.settings import Settings

log = logging.getLogger("litstream.lifecycle")
OFFSET_KEY = b"__faust\0offset__"  # where Faust's RocksDB store keeps a partition's persisted changelog offset


def local_copies(tabledir: Path, table: str) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for path in tabledir.glob(f"{table}-*.db"):
        suffix = path.name[len(table) + 1:-3]
        if suffix.isdigit():
            out[int(suffix)] = path
    return out


def persisted_offset(path: Path) -> int | None:
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(str(path), options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        raw = db.get(OFFSET_KEY)
        return int(raw) if raw is not None else None
    finally:
        db.close()


def discard_if_ahead(settings: Settings, tabledir: Path, table: str, changelog: str) -> list[int]:
    """Remove every local copy if any is ahead of its changelog partition; returns the partitions found ahead."""
    copies = local_copies(tabledir, table)
    if not copies:
        return []
    offsets = {p: persisted_offset(path) for p, path in copies.items()}
    ends = end_offsets(settings, changelog, sorted(copies))
    ahead = sorted(p for p, off in offsets.items() if off is not None and off >= ends[p])
    if ahead:
        log.warning("the local table copy in %s is ahead of %s (partitions %s): the log was reset since it was "
                    "written; removing it, the table is rebuilt from the changelog", tabledir, changelog, ahead)
        for path in copies.values():
            shutil.rmtree(path, ignore_errors=True)
    return ahead
