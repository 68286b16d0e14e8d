"""CPU time and memory of the processes a benchmark runs, by name (psutil when installed, else /proc)."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process and its children (psutil, else /proc/<pid>/stat); for this process,
    its own only (the stack's processes are its children)."""
    try:
        import psutil
    except ImportError:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None
    try:
        proc = psutil.Process(pid)
        procs = [proc, *(proc.children(recursive=True) if pid != os.getpid() else [])]
        return float(sum(p.cpu_times().user + p.cpu_times().system for p in procs))
    except psutil.Error:
        return None


def rss_bytes(pid: int) -> int | None:
    """RSS of a process and its children (psutil if installed, else /proc/<pid>/status VmRSS)."""
    try:
        import psutil
    except ImportError:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None
    try:
        proc = psutil.Process(pid)
        children = proc.children(recursive=True) if pid != os.getpid() else []
        return int(proc.memory_info().rss + sum(c.memory_info().rss for c in children))
    except psutil.Error:
        return None


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named process (those that are gone are left out)."""
    return {name: cpu for name, pid in pids.items() if (cpu := cpu_seconds(pid)) is not None}


def rss_file_of(pids: dict[str, int]) -> dict[str, float]:
    """The file-backed part of each named process's RSS in MiB (/proc/<pid>/status RssFile: mapped code and data
    files, reclaimable, shared with other processes mapping the same file)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("RssFile:"):
                    out[name] = int(line.split()[1]) / 1024
        except OSError:
            continue
    return out


def rss_of(pids: dict[str, int]) -> dict[str, float]:
    """RSS in MiB of each named process (those that are gone are left out)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        rss = rss_bytes(pid)
        if rss is not None:
            out[name] = rss / 2**20
    return out
