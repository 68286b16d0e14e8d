"""Give back the pages of the chDB engine's code that only its start-up touched.

Loading chDB reads ~200 MiB of its 530 MiB library into the process (static initialisers spread across the whole
file), and those clean file pages stay in the owner's RSS for as long as it runs. Once the engine is open and
migrated, the sink drops them from its page tables (``MADV_DONTNEED``): the pages stay in the kernel's page cache,
and those the engine runs again come back on first touch as minor faults (~55 MiB after the first insert and
query). Only mappings that cannot be written and hold no private copy of a page are touched, so nothing the
process changed (relocations, data) is ever discarded: a dropped page reads back exactly as the file holds it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("litstream.clickhouse")
MADV_DONTNEED = 4


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    path: str
    anonymous_kb: int  # pages of this mapping the process holds a private copy of

    @property
    def droppable(self) -> bool:
        """Read-only and unchanged: every page equals the file's, so dropping it loses nothing."""
        return "w" not in self.perms and self.anonymous_kb == 0


def file_mappings(smaps: str, fragment: str) -> list[Mapping]:
    """The mappings of ``/proc/<pid>/smaps`` text whose file path contains ``fragment``."""
    found: list[Mapping] = []
    header: list[str] | None = None
    for line in smaps.splitlines():
        fields = line.split(maxsplit=5)
        if fields and "-" in fields[0] and len(fields) >= 5 and ":" not in fields[0]:
            header = fields
        elif header is not None and fields[:1] == ["Anonymous:"]:
            if len(header) == 6 and fragment in header[5]:
                start, end = (int(x, 16) for x in header[0].split("-"))
                found.append(Mapping(start, end, header[1], header[5], int(fields[1])))
            header = None
    return found


def drop_clean_library_pages(fragment: str) -> int:
    """Drop from this process's page tables the clean, read-only pages of libraries whose path contains
    ``fragment``; returns the bytes of the mappings advised (0 where the platform cannot)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        smaps = Path("/proc/self/smaps").read_text()
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = 0
    for m in file_mappings(smaps, fragment):
        if m.droppable and libc.madvise(m.start, m.end - m.start, MADV_DONTNEED) == 0:
            advised += m.end - m.start
    log.debug("dropped %d MiB of clean library mappings (%s)", advised >> 20, fragment)
    return advised
