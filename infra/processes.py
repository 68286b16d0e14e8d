"""Child processes the stack and the benchmarks start: stopping one politely, then firmly, and never outliving
the process that started it."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

PARENT_ENV = "LITSTREAM_PARENT_PID"  # set for a child the stack starts: the pid it must not outlive
PR_SET_PDEATHSIG = 1
# How long an orphan may take to stop before it exits anyway: its stop may wait on a broker that went with the
# parent (Faust's worker retries its last commits for minutes). Nothing is lost: what it did not commit is read
# again by the next owner of its partitions.
ORPHAN_STOP_S = 30.0


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


def child_env() -> dict[str, str]:
    """Environment for a Python child that must stop when this process dies (read by :func:`stop_with_parent`)."""
    return {PARENT_ENV: str(os.getpid())}


def stop_with_parent(orphan_stop_s: float = ORPHAN_STOP_S) -> None:
    """In a child started with :func:`child_env`: get SIGTERM when the parent dies, however it dies (a SIGKILLed
    `litstream up` or `Trainer.fit` must not leave its processors running), and exit if that stop has not ended
    ``orphan_stop_s`` later. The variable is consumed here, so the child's own children do not inherit it."""
    parent = os.environ.pop(PARENT_ENV, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(parent):  # the parent died before the line above could take effect
        raise SystemExit(f"the process that started this one ({parent}) is gone; stopping")
    threading.Thread(target=_exit_when_orphaned, args=(int(parent), orphan_stop_s), name="orphan-watch",
                     daemon=True).start()


def _exit_when_orphaned(parent: int, stop_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    time.sleep(stop_s)  # the SIGTERM of the parent's death has had its time
    sys.stderr.write(f"the process that started this one ({parent}) is gone and this one has not stopped within "
                     f"{stop_s:g} s of it; exiting\n")
    sys.stderr.flush()
    os._exit(1)


def with_parent_death_signal(cmd: list[str]) -> list[str]:
    """``cmd`` run so that it gets SIGTERM when this process dies (util-linux ``setpriv``, where there is one): for
    children that are not litstream's own, such as the broker's JVM."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", "TERM", "--", *cmd] if setpriv else cmd
