"""Child processes the stack and the benchmarks start: stopping one politely, then firmly."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float) -> None:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; a process already gone is left alone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
