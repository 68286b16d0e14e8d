"""Running the pipeline's processes on one machine: the embedded broker plus one process per role."""

from __future__ import annotations

import collections
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from litstream.infra import health
from litstream.infra.broker import KafkaBroker
from litstream.infra.kafka import create_topics, wait_for_broker
from litstream.infra.processes import child_env, stop_process
from litstream.infra.settings import Settings

from .roles import Role, store_roles

STACK_FILE = "stack.json"
LOCK_FILE = "stack.lock"
LOG_TAIL_LINES = 20


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as LITSTREAM_* variables, for child processes."""
    env: dict[str, str] = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        # containers as JSON, which is how the settings read them back from the environment
        env[f"LITSTREAM_{name.upper()}"] = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return env


def write_stack_file(settings: Settings, broker: KafkaBroker, **extra: Any) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    tmp = settings.data_dir / f".{STACK_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({
        "pid": os.getpid(), "bootstrap_servers": broker.bootstrap, "topic_prefix": settings.topic_prefix,
        "partitions": settings.partitions, "clickhouse_dsn": settings.resolved_clickhouse_dsn, **extra,
    }))
    tmp.replace(settings.data_dir / STACK_FILE)


def running_stack(data_dir: Path) -> dict[str, Any] | None:
    """The embedded stack started by `litstream up` in this data dir, if it still runs."""
    try:
        info: dict[str, Any] = json.loads((data_dir / STACK_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return info if health.pid_alive(int(info.get("pid", 0))) else None


class StackLockedError(RuntimeError):
    """Another `litstream up` holds this data dir; the message names its pid and ports."""


class StackLock:
    """An exclusive ``flock`` on ``<data_dir>/stack.lock``: one stack per data dir. The kernel drops it when the
    holder dies, so a crashed stack never leaves a stale lock behind."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._fd: int | None = None

    def acquire(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StackLockedError(_held_message(self.data_dir)) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays, harmless
            self._fd = None


def _held_message(data_dir: Path) -> str:
    info = running_stack(data_dir) or {}
    who = f"pid {info['pid']}" if "pid" in info else "another process (starting)"
    ports = ", ".join(f"{k} {info[k]}" for k in ("bootstrap_servers", "gateway_url") if info.get(k))
    return (f"a stack already runs in {data_dir.resolve()}: {who}" + (f", {ports}" if ports else "")
            + ". Use it (`litstream status`), stop it (Ctrl-C in its shell"
            + (f", or `kill {info['pid']}`" if "pid" in info else "") + "), or set LITSTREAM_DATA_DIR elsewhere.")


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a log file (empty when there is none)."""
    if path is None or not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 64 * 1024))
        text = f.read().decode(errors="replace")
    return text.splitlines()[-lines:]


class RoleProcess:
    """One child process running ``litstream <args>``; its output goes to its log file and, prefixed, to ours."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path | None,
                 echo: IO[str] | None) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path or os.devnull, "ab")  # noqa: SIM115 (closed by the pump or stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "litstream.app.cli", *args], env={**os.environ, **env, **child_env()},
            stdout=subprocess.PIPE if echo is not None else self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._pump_thread: threading.Thread | None = None
        if echo is not None:
            self._pump_thread = threading.Thread(target=self._pump, args=(echo,), daemon=True)
            self._pump_thread.start()

    def _pump(self, echo: IO[str]) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self._log.write(line)
            self._log.flush()
            echo.write(f"{self.name:>10} | {line.decode(errors='replace')}")
            echo.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self) -> list[str]:
        if self._pump_thread is not None:
            self._pump_thread.join(timeout=2.0)  # the last lines of a dead child are still in the pipe
        return log_tail(self.log_path)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (the child's service stops it cleanly), SIGKILL after ``timeout`` seconds."""
        stop_process(self.proc, timeout)
        if self._pump_thread is not None:
            self._pump_thread.join(timeout=2.0)
        self._log.close()


@dataclass(frozen=True)
class RestartPolicy:
    """A crashed child is restarted after ``backoff_s * 2**k`` (at most ``max_backoff_s``), k its recent crashes;
    more than ``max_restarts`` crashes within ``window_s`` and it is failing for good: the stack stops."""

    backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    max_restarts: int = 5
    window_s: float = 120.0

    def delay(self, recent_crashes: int) -> float:
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** max(0, recent_crashes - 1)))


class ChildFailedError(RuntimeError):
    """A child that kept crashing; the message names it, its exit code and the last lines of its log."""

    def __init__(self, name: str, code: int | None, crashes: int, log_path: Path | None, tail: list[str]) -> None:
        self.name, self.code, self.tail = name, code, tail
        lines = "\n".join(f"    {line}" for line in tail) or "    (its log is empty)"
        super().__init__(f"{name} kept failing ({crashes} crashes, last exit code {code}); the stack stopped. "
                         f"Last lines of {log_path or 'its output'}:\n{lines}")


@dataclass
class _Child:
    proc: RoleProcess
    crashes: collections.deque[float] = field(default_factory=collections.deque)
    restart_at: float | None = None  # when a crashed child is due to start again


class Stack:
    """The embedded broker (optional) and role processes: started, supervised (restarted with backoff when they
    crash) and stopped together. One stack per data dir (:class:`StackLock`)."""

    def __init__(self, settings: Settings, echo: IO[str] | None = None,
                 policy: RestartPolicy | None = None) -> None:
        self.settings = settings
        self.echo = echo
        self.policy = policy or RestartPolicy()
        self.broker: KafkaBroker | None = None
        self._broker_crashes: collections.deque[float] = collections.deque()
        self.children: dict[str, _Child] = {}
        self.lock = StackLock(settings.data_dir)
        self.log_dir = settings.data_dir / "logs"

    @property
    def roles(self) -> dict[str, RoleProcess]:
        return {name: child.proc for name, child in self.children.items()}

    def acquire(self) -> None:
        """Take the data dir, before touching anything in it; StackLockedError when another stack has it."""
        if self.lock._fd is None:
            self.lock.acquire()
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def start_broker(self) -> str:
        """The embedded Kafka broker, its log under ``<data_dir>/kafka`` (``broker_storage=durable``) or in a
        throwaway directory (``ephemeral``)."""
        self.acquire()
        durable = self.settings.broker_storage == "durable"
        log_dir = self.settings.data_dir / "kafka"
        if not durable or not (log_dir / "data" / "meta.properties").exists():
            # Local copies of tables built from the log (the lifecycle processor's RocksDB store) belong to a log
            # that is gone: they are rebuilt from the new one.
            shutil.rmtree(self.settings.data_dir / "faust", ignore_errors=True)
        self.broker = KafkaBroker(log_dir.resolve() if durable else None, heap_mb=self.settings.broker_heap_mb,
                                  log_path=self.log_dir / "broker.log")
        self.broker.start()
        self.settings = self.settings.model_copy(update={"bootstrap_servers": self.broker.bootstrap})
        write_stack_file(self.settings, self.broker)
        return self.broker.bootstrap

    def describe(self, **extra: Any) -> None:
        """Add facts (e.g. the gateway's URL) to the stack file, for other commands and a refused second `up`."""
        if self.broker is not None:
            info = running_stack(self.settings.data_dir) or {}
            write_stack_file(self.settings, self.broker, **{**info, **extra, "pid": os.getpid()})

    def create_topics(self) -> list[str]:
        wait_for_broker(self.settings)
        return create_topics(self.settings)

    def start(self, name: str, *args: str) -> RoleProcess:
        """Start a child; a child of the same name that ran before is stopped (if still alive) and replaced."""
        self.acquire()
        if name in self.children:
            self.children[name].proc.stop()
        proc = RoleProcess(name, list(args), settings_env(self.settings), self.log_dir / f"{name}.log", self.echo)
        self.children[name] = _Child(proc)
        return proc

    def start_role(self, role: Role) -> RoleProcess:
        """Start one role of the stack's declaration (roles.py)."""
        return self.start(role.name, *role.args)

    def wait_for(self, role: Role, timeout: float | None = None) -> None:
        """Wait until ``role`` is ready as its declaration says."""
        self.wait_ready(role.name, role.health, role.ready_timeout_s if timeout is None else timeout,
                        key=role.ready_key)

    def start_roles(self, roles: Sequence[Role]) -> None:
        """Start ``roles`` in their order, then wait until each is ready (they start side by side)."""
        for role in roles:
            self.start_role(role)
        for role in roles:
            self.wait_for(role)

    def start_store(self, gateway_port: int, host: str = "127.0.0.1") -> str:
        """The store behind the REST APIs (roles.store_roles), each waited for; returns the gateway's URL."""
        self.start_roles(store_roles(host, gateway_port))
        return f"http://{host}:{gateway_port}"

    def supervise(self, now: float | None = None) -> list[str]:
        """One round: restart crashed children whose backoff is over; returns what happened, one line each.
        A broker that exited is started again on its log at once. Raises :class:`ChildFailedError` for a child
        past its restarts, RuntimeError for a broker that cannot run (a cause its log names, or past its
        restarts)."""
        now = time.monotonic() if now is None else now
        events: list[str] = []
        if self.broker is not None and not self.broker.alive():
            events.append(self._broker_crashed(now))
        for name, child in self.children.items():
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.proc = RoleProcess(name, child.proc.args, settings_env(self.settings),
                                             child.proc.log_path, self.echo)
                    child.restart_at = None
                    events.append(f"{name} restarted (pid {child.proc.proc.pid})")
                continue
            if child.proc.alive():
                continue
            events.append(self._crashed(name, child, now))
        return events

    def _broker_crashed(self, now: float) -> str:
        """The broker exited: started again on its log (the same port when still free), like any child, unless
        its log names a cause a restart cannot cure or it keeps crashing; then the stack stops, in one line."""
        assert self.broker is not None and self.broker.proc is not None
        code = self.broker.proc.returncode
        self._broker_crashes.append(now)
        while self._broker_crashes and now - self._broker_crashes[0] > self.policy.window_s:
            self._broker_crashes.popleft()
        if self.broker.known_cause() or len(self._broker_crashes) > self.policy.max_restarts:
            raise RuntimeError(self.broker.failure(f"exited (code {code})"))
        self.broker.start()
        return (f"broker exited with code {code}; started again on its log at {self.broker.bootstrap} (crash "
                f"{len(self._broker_crashes)} of {self.policy.max_restarts} allowed in {self.policy.window_s:.0f}s)")

    def _crashed(self, name: str, child: _Child, now: float) -> str:
        code = child.proc.proc.returncode
        child.proc.stop()
        child.crashes.append(now)
        while child.crashes and now - child.crashes[0] > self.policy.window_s:
            child.crashes.popleft()
        if len(child.crashes) > self.policy.max_restarts:
            raise ChildFailedError(name, code, len(child.crashes), child.proc.log_path, child.proc.tail())
        delay = self.policy.delay(len(child.crashes))
        child.restart_at = now + delay
        return f"{name} exited with code {code}; restarting in {delay:.1f}s (crash {len(child.crashes)} of " \
               f"{self.policy.max_restarts} allowed in {self.policy.window_s:.0f}s)"

    def wait_ready(self, name: str, role: str, timeout: float = 60.0, key: str | None = None) -> None:
        """Wait until the role's process reports itself alive (and, if given, has ``key`` in its report)."""
        proc = self.roles[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"{name} exited with code {proc.proc.returncode}; see {proc.log_path}")
            info = health.read(self.settings.data_dir, role)
            if info and info.get("pid") == proc.proc.pid and not info.get("starting") and (key is None or key in info):
                return
            time.sleep(0.2)
        raise TimeoutError(f"{name} was not ready within {timeout:.0f}s; see {proc.log_path}")

    def stop(self) -> None:
        for child in reversed(list(self.children.values())):
            child.proc.stop()
        if self.broker is not None:
            self.broker.stop()
            (self.settings.data_dir / STACK_FILE).unlink(missing_ok=True)
        self.lock.release()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
