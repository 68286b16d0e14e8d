"""Give back the pages of the chDB engine's code that only its start-up touched.

Loading chDB reads ~200 MiB of its 530 MiB library into the process (static initialisers spread across the whole
file), and those clean file pages stay in the owner's RSS until the machine runs short of memory. Paging them out
once the engine is open and migrated leaves what the sink really uses: the pages it runs fault back in from the
page cache (~55 MiB after the first insert and query). Only clean file-backed pages of the library's own mappings
are affected: nothing is written, and another process sharing a page keeps it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from pathlib import Path

log = logging.getLogger("litstream.clickhouse")
MADV_PAGEOUT = 21  # Linux 5.4+: reclaim the range's pages now (a hint: pages in use elsewhere stay)


def library_mappings(fragment: str, maps: str) -> list[tuple[int, int]]:
    """The address ranges of ``/proc/<pid>/maps`` text whose file path contains ``fragment``."""
    ranges = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fragment in fields[5]:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def page_out_library(fragment: str) -> int:
    """Ask the kernel to page out this process's mappings of files whose path contains ``fragment``; returns the
    bytes advised (0 where the kernel or platform cannot)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        maps = Path("/proc/self/maps").read_text()
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = 0
    for start, end in library_mappings(fragment, maps):
        if libc.madvise(start, end - start, MADV_PAGEOUT) == 0:
            advised += end - start
        else:  # EINVAL on kernels before 5.4: nothing to gain, nothing lost
            log.debug("madvise(MADV_PAGEOUT) refused: errno %d", ctypes.get_errno())
            return advised
    return advised
