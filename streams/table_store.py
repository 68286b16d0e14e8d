"""The lifecycle table's local RocksDB copy, checked against its changelog before Faust opens it.

With ``table_store=rocksdb`` each table partition lives in ``<tabledir>/rollouts-<partition>.db`` with the
changelog offset it has read up to (Faust's "persisted offset"). Faust trusts that copy and reads the changelog
only past that offset. If the log was reset since (a fresh embedded broker, topics deleted and created again),
the copy's offset points past the changelog's end and Faust's recovery stops the worker with a ConsistencyError,
at every restart. So at startup a copy ahead of its changelog is removed (every partition: a reset log
invalidates them all) and the table is rebuilt from the changelog, as with the memory store. (A reset log that
has already grown past the old offset cannot be told apart this way: remove ``<data_dir>/faust`` when a log is
reset on purpose.)

Its memory: Faust gives each partition's database a block cache and memtables of its own, so the memory grows with
the partitions (with 8 MiB caches and 2 x 4 MiB memtables, 16 partitions could hold 256 MiB), and the index and
filter blocks of its files sit outside any cache. :func:`bound_memory` makes every partition draw on one cache.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from faust.stores.rocksdb import RocksDBOptions

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


class BudgetedOptions(RocksDBOptions):
    """Faust's RocksDB options (rocksdict), with every database opened through them sharing one LRU block cache of
    ``memory`` bytes that also holds their index and filter blocks and is charged with their memtables (a write
    buffer manager flushes the fullest once they pass ``memtables`` bytes in all)."""

    def __init__(self, memory: int, memtables: int, **options: Any) -> None:
        from rocksdict import Cache, WriteBufferManager

        super().__init__(**options, use_rocksdict=True)
        self.cache = Cache(memory)
        self.write_buffers = WriteBufferManager.new_write_buffer_manager_with_cache(memtables, False, self.cache)

    def as_options(self) -> Any:
        from rocksdict import BlockBasedIndexType, BlockBasedOptions, Options

        table = BlockBasedOptions()
        table.set_bloom_filter(self.bloom_filter_size, block_based=True)
        table.set_block_cache(self.cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)  # the newest files' are read most: kept
        table.set_index_type(BlockBasedIndexType.binary_search())
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        if self.max_open_files is not None:
            options.set_max_open_files(self.max_open_files)
        options.set_write_buffer_size(self.write_buffer_size)
        options.set_max_write_buffer_number(self.max_write_buffer_number)
        options.set_target_file_size_base(self.target_file_size_base)
        options.set_write_buffer_manager(self.write_buffers)
        options.set_block_based_table_factory(table)
        return options


def bound_memory(store: Any, memory: int, memtables: int) -> None:
    """Open every partition of ``store`` (Faust's RocksDB store, before it opened any) with :class:`BudgetedOptions`:
    its memory is then bounded by ``memory``, whatever the number of partitions or rollouts."""
    current: RocksDBOptions = store.rocksdb_options
    store.rocksdb_options = BudgetedOptions(
        memory, memtables, write_buffer_size=current.write_buffer_size,
        max_write_buffer_number=current.max_write_buffer_number, bloom_filter_size=current.bloom_filter_size,
        max_open_files=current.max_open_files, target_file_size_base=current.target_file_size_base)
