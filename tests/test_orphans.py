"""A process of the stack never outlives the one that started it, even when its own stop hangs (Faust's worker
retrying its last commits against a broker that went with the parent)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

CHILD = textwrap.dedent("""
    import signal, time
    from litstream.infra.processes import stop_with_parent
    stop_with_parent(orphan_stop_s=1.0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stop that never ends
    print("ready", flush=True)
    time.sleep(120)
""")
PARENT = textwrap.dedent("""
    import os, subprocess, sys
    from litstream.infra.processes import child_env
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**os.environ, **child_env()},
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert child.stdout.readline().strip() == "ready"
    print(child.pid, flush=True)
    os._exit(0)  # the parent dies; its child is left behind
""")


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # exited, not reaped by whoever adopted it


def test_an_orphan_whose_stop_hangs_exits_anyway() -> None:
    out = subprocess.run([sys.executable, "-c", PARENT, CHILD], capture_output=True, text=True, timeout=60,
                         check=True)
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 30
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gone(pid), f"process {pid} outlived its parent"
