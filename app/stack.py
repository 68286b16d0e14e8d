"""Running the pipeline's processes on one machine: the embedded broker plus one process per role."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from litstream.infra import health
from litstream.infra.broker import EmbeddedBroker
from litstream.infra.kafka import create_topics, wait_for_broker
from litstream.infra.log_storage import MIN_SESSION_TIMEOUT_MS, EmbeddedLog
from litstream.infra.settings import Settings

STACK_FILE = "stack.json"


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


def write_stack_file(settings: Settings, broker: EmbeddedBroker) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    (settings.data_dir / STACK_FILE).write_text(json.dumps({
        "pid": os.getpid(), "bootstrap_servers": broker.bootstrap, "topic_prefix": settings.topic_prefix,
        "partitions": settings.partitions, "clickhouse_dsn": settings.resolved_clickhouse_dsn,
    }))


def running_stack(data_dir: Path) -> dict[str, Any] | None:
    """The embedded stack started by `litstream up` in this data dir, if it still runs."""
    try:
        info: dict[str, Any] = json.loads((data_dir / STACK_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return info if health.pid_alive(int(info.get("pid", 0))) else None


class RoleProcess:
    """One child process running ``litstream <args>``; its output goes to a log file or, prefixed, to ours."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path | None, echo: IO[str] | None) -> None:
        self.name = name
        self.log_path = log_path
        out: int | IO[bytes] = subprocess.PIPE if echo is not None else open(log_path or os.devnull, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "litstream.app.cli", *args], env={**os.environ, **env},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        if echo is not None:
            threading.Thread(target=self._pump, args=(echo,), daemon=True).start()

    def _pump(self, echo: IO[str]) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            echo.write(f"{self.name:>10} | {line.decode(errors='replace')}")
            echo.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Stack:
    """The embedded broker (optional) and role processes, stopped together."""

    def __init__(self, settings: Settings, echo: IO[str] | None = None) -> None:
        self.settings = settings
        self.echo = echo
        self.broker: EmbeddedBroker | None = None
        self.log: EmbeddedLog | None = None
        self.roles: dict[str, RoleProcess] = {}
        self.log_dir = settings.data_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def start_broker(self) -> str:
        """The embedded broker on the settings' storage (``broker_storage``: durable on disk, or memory)."""
        log = EmbeddedLog(self.settings.broker_storage, self.settings.data_dir, self.log_dir)
        unclean = (self.settings.data_dir / STACK_FILE).exists()  # the last run did not stop cleanly
        if not log.durable or unclean or not log.root.exists():
            # Local copies of tables built from the log (the lifecycle processor's RocksDB store) are rebuilt
            # from it: the log starts empty (memory), or may have lost its last writes (a killed durable log).
            shutil.rmtree(self.settings.data_dir / "faust", ignore_errors=True)
        self.log = log
        self.broker = log.start()
        update: dict[str, object] = {"bootstrap_servers": self.broker.bootstrap}
        if log.durable:  # noida-db refuses group sessions under 6 s (Apache Kafka's group.min.session.timeout.ms)
            update["local_session_timeout_ms"] = max(self.settings.local_session_timeout_ms, MIN_SESSION_TIMEOUT_MS)
        self.settings = self.settings.model_copy(update=update)
        write_stack_file(self.settings, self.broker)
        return self.broker.bootstrap

    def create_topics(self) -> list[str]:
        wait_for_broker(self.settings)
        return create_topics(self.settings)

    def start(self, name: str, *args: str) -> RoleProcess:
        proc = RoleProcess(name, list(args), settings_env(self.settings), self.log_dir / f"{name}.log", self.echo)
        self.roles[name] = proc
        return proc

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
        for proc in reversed(list(self.roles.values())):
            proc.stop()
        if self.log is not None:
            self.log.stop()
            (self.settings.data_dir / STACK_FILE).unlink(missing_ok=True)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
