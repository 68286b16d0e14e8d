"""Liveness of long-running roles: each touches a small file; `litstream healthcheck ROLE` reads it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

STALE_AFTER_S = 30.0
_annotations: dict[str, Any] = {}  # facts added to every beat of this process (e.g. its metrics URL)


def health_dir(data_dir: Path) -> Path:
    path = data_dir / "health"
    path.mkdir(parents=True, exist_ok=True)
    return path


def annotate(**info: Any) -> None:
    """Add ``info`` to every later beat of this process."""
    _annotations.update(info)


def beat(data_dir: Path, role: str, **info: Any) -> None:
    """Record that ``role`` is alive now (atomic replace, so a reader never sees half a file)."""
    path = health_dir(data_dir) / f"{role}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"role": role, "pid": os.getpid(), "time": time.time(), **_annotations, **info}))
    tmp.replace(path)


class Heartbeat:
    """A process's beats with its figures (``report()``), at most every ``every_s`` when :meth:`tick` is called
    from inside its own loop: a beat then also says the loop still turns (a wedged loop goes stale)."""

    def __init__(self, data_dir: Path, role: str, report: Callable[[], Mapping[str, Any]],
                 every_s: float = 2.0) -> None:
        self.data_dir = data_dir
        self.role = role
        self.report = report
        self.every_s = every_s
        self._last = float("-inf")

    def __call__(self, **extra: Any) -> None:
        """Beat now."""
        beat(self.data_dir, self.role, **self.report(), **extra)
        self._last = time.monotonic()

    def tick(self) -> None:
        """Beat if the last beat is ``every_s`` old."""
        if time.monotonic() - self._last > self.every_s:
            self()


def read(data_dir: Path, role: str) -> dict[str, Any] | None:
    path = data_dir / "health" / f"{role}.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    data["age_s"] = time.time() - float(data.get("time", 0))
    data["alive"] = data["age_s"] < STALE_AFTER_S and pid_alive(int(data.get("pid", 0)))
    return data


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
