"""Failpoints: named places in the code where a process can be made to die on purpose, for fault tests.

``LITSTREAM_FAILPOINTS`` lists the armed points, comma-separated; ``name`` dies at the first hit, ``name@N`` at the
N-th. A hit ends the process at once with ``os._exit(137)`` — no ``finally``, no flush, no commit, no atexit — as
a SIGKILL would, but at an exact point. With the variable unset (production) a failpoint costs a dict lookup.

Failpoints in the code:

| name | where |
|---|---|
| ``span-sink.after-insert`` | the sink, after a batch's rows are in ClickHouse and before its offsets are committed |
| ``lifecycle.after-table-write`` | the lifecycle processor, after an event's new state is in its table (the local store), before the changelog write or any effect is sent |
"""

from __future__ import annotations

import os
import sys
import threading

ENV = "LITSTREAM_FAILPOINTS"
EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL


def parse(spec: str | None) -> dict[str, int]:
    """``"a,b@3"`` -> ``{"a": 1, "b": 3}``: the hit at which each point fires."""
    armed: dict[str, int] = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, nth = item.partition("@")
        try:
            hit = int(nth) if nth else 1
        except ValueError:
            raise ValueError(f"{ENV}: {item!r} is not NAME or NAME@N") from None
        if hit < 1:
            raise ValueError(f"{ENV}: {item!r}: N counts hits from 1")
        armed[name.strip()] = hit
    return armed


_armed = parse(os.environ.get(ENV))
_hits: dict[str, int] = {}
_lock = threading.Lock()


def failpoint(name: str) -> None:
    """Die here (exit code 137) if ``name`` is armed and this is the hit it waits for."""
    if name not in _armed:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] != _armed[name]:
            return
    sys.stderr.write(f"failpoint {name} hit {_armed[name]}: exiting with {EXIT_CODE}\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)
