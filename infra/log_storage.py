"""Where the embedded broker keeps its log: on disk (``durable``, the default) or in memory.

``durable`` runs noida-db (PyPI, pinned) as the Kafka-protocol server, its log under ``<data_dir>/log``; ``memory``
runs Tansu (``infra/broker.py``) on ``memory://``. docs/durable-log.md has the measurements behind the choice,
and the known limits of each (noida-db loses what was written since its last snapshot on a SIGKILL or power loss).

Also here: the loopback S3 servers that Tansu's ``s3://`` storage was measured on (``bench/broker_storage.py``,
``tests/test_faults.py``); Tansu on ``s3://`` loses acknowledged records when two producers write to one partition
at once, so it is no storage for the stack:
- ``s3rver`` (npm 3.7.1; ``make s3rver``): objects as files;
- ``moto`` (PyPI, the test extra): in memory, so only a broker restart survives;
- ``local-s3-server`` (PyPI): files, but no paging in its listings; Tansu's produce fails on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .broker import EmbeddedBroker, ServerProcess, free_port

BUCKET = "tansu"
S3RVER_VERSION = "3.7.1"
# Credentials of the loopback server: s3rver accepts only its own fixed pair (with mismatched signatures allowed).
_S3RVER_KEY = "S3RVER"


def s3rver_script() -> Path | None:
    """s3rver's entry script, installed by ``make install`` into the virtualenv (or named by LITSTREAM_S3RVER)."""
    named = os.environ.get("LITSTREAM_S3RVER")
    candidates = [Path(named)] if named else []
    candidates.append(Path(sys.prefix) / "s3rver" / "node_modules" / "s3rver" / "bin" / "s3rver.js")
    return next((c for c in candidates if c.is_file()), None)


def install_hint() -> str:
    return (f"the durable log needs node and s3rver: run `make install` (it runs `npm install --prefix "
            f"{Path(sys.prefix) / 's3rver'} s3rver@{S3RVER_VERSION}`), set LITSTREAM_S3RVER to s3rver's "
            "bin/s3rver.js, or start with `litstream up --ephemeral` (LITSTREAM_BROKER_STORAGE=memory)")


@dataclass
class S3Server(ServerProcess):
    """One loopback S3 server process holding the broker's bucket under ``root``."""

    root: Path
    kind: str = "s3rver"  # s3rver | moto | local-s3-server
    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        if self.kind == "s3rver":
            script, node = s3rver_script(), shutil.which("node")
            if script is None or node is None:
                raise RuntimeError(install_hint())
            return [node, str(script), "-d", str(self.root), "-a", "127.0.0.1", "-p", str(self.port), "--silent",
                    "--configure-bucket", BUCKET, "--allow-mismatched-signatures", "--no-vhost-buckets"]
        if self.kind == "moto":
            return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        if self.kind == "local-s3-server":
            return [shutil.which("local-s3-server") or "local-s3-server", "--hostname", "127.0.0.1",
                    "--port", str(self.port), "--root-dir", str(self.root)]
        raise ValueError(f"unknown S3 server {self.kind!r}: s3rver, moto or local-s3-server")

    def broker_env(self) -> dict[str, str]:
        """What the broker needs to use this server (and never a real AWS endpoint)."""
        return {"AWS_ENDPOINT": self.url, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": _S3RVER_KEY,
                "AWS_SECRET_ACCESS_KEY": _S3RVER_KEY, "AWS_DEFAULT_REGION": "us-east-1"}

    def start(self, timeout: float = 30.0) -> S3Server:
        self.root.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._bucket_ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the S3 server ({self.kind}) exited with code {self.proc.returncode}"
                                   + (f"; see {self.log_path}" if self.log_path else ""))
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the S3 server ({self.kind}) did not answer on {self.url} in {timeout:.0f}s")
            time.sleep(0.1)
        return self

    def _bucket_ready(self) -> bool:
        """The bucket exists (created here for the servers that do not create it at start)."""
        try:
            urllib.request.urlopen(urllib.request.Request(f"{self.url}/{BUCKET}", method="HEAD"), timeout=2)
            return True
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                self._create_bucket()
            return False
        except OSError:
            return False

    def _create_bucket(self) -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(f"{self.url}/{BUCKET}", method="PUT"), timeout=2)
        except OSError:
            pass  # asked again on the next probe


def noida_binary() -> str:
    """The noida-db server binary shipped in its wheel (or named by LITSTREAM_NOIDA_DB)."""
    named = os.environ.get("LITSTREAM_NOIDA_DB")
    if named:
        return named
    try:
        from importlib.resources import files

        path = Path(str(files("noida_db").joinpath("noida-db")))
    except ImportError:
        path = None
    if path is None or not path.is_file():
        raise RuntimeError(f"the durable log needs noida-db: pip install 'litstream[local]' (or noida-db=={NOIDA_VERSION}), "
                           "or start with `litstream up --ephemeral` (LITSTREAM_BROKER_STORAGE=memory)")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)  # the wheel's launcher does the same before its first run
    return str(path)


MIN_SESSION_TIMEOUT_MS = 6000  # noida-db's group.min.session.timeout.ms, as Apache Kafka's default
NOIDA_VERSION = "0.2.2"  # 0.2.3 runs too and has the same two limits (docs/durable-log.md)


class NoidaBroker(EmbeddedBroker):
    """noida-db's Kafka service alone, its log under ``root`` (one snapshot file, written by temp file + rename)."""

    def __init__(self, root: Path, port: int | None = None, log_path: Path | None = None) -> None:
        super().__init__(port=port, log_path=log_path)
        self.root = root
        self.storage = f"noida-db:{root}"

    def start(self, timeout: float = 60.0) -> NoidaBroker:
        self.root.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [noida_binary(), "start", "--data-dir", str(self.root), "--only", "kafka", "--host", "127.0.0.1",
             "--kafka-port", str(self.port)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_answering(timeout)  # loading a large snapshot takes a while
        return self

    def stop(self, timeout: float = 120.0) -> None:
        """SIGTERM: it writes its last snapshot before it exits (seconds for a log of a few hundred MB)."""
        super().stop(timeout)


class EmbeddedLog:
    """The embedded broker with its storage: ``durable`` (noida-db, the log under ``<data_dir>/log``) or ``memory``
    (Tansu on ``memory://``: everything is gone when it stops). docs/durable-log.md says why."""

    def __init__(self, storage: str, data_dir: Path, log_dir: Path | None = None, port: int | None = None) -> None:
        if storage not in ("durable", "memory"):
            raise ValueError(f"unknown broker storage {storage!r}: durable or memory")
        self.storage = storage
        self.root = data_dir / "log"
        self.log_dir = log_dir
        self.port = port
        self.broker: EmbeddedBroker | None = None

    @property
    def durable(self) -> bool:
        return self.storage == "durable"

    def start(self) -> EmbeddedBroker:
        log_path = self.log_dir / "broker.log" if self.log_dir else None
        if self.durable:
            check_free_space(self.root)
            self.broker = NoidaBroker(self.root, port=self.port, log_path=log_path)
        else:
            self.broker = EmbeddedBroker(port=self.port, log_path=log_path)
        return self.broker.start()

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# Below this much free space where the log is kept, the stack refuses to start (and `status` warns): the S3
# server would fail writes part-way, and the broker would refuse produces with errors the clients retry forever.
MIN_FREE_BYTES = 256 * 1024 * 1024


def check_free_space(path: Path, minimum: int = MIN_FREE_BYTES) -> None:
    """A clear error when the disk that holds the log is (nearly) full."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < minimum:
        raise RuntimeError(f"only {free // 2**20} MB free on the disk of {path} (the broker's log needs at least "
                           f"{minimum // 2**20} MB): free some space, move LITSTREAM_DATA_DIR, or shorten the "
                           "topics' retention (docs/durable-log.md)")


def log_files_bytes(data_dir: Path) -> int:
    """Bytes the durable log takes under ``data_dir`` (0 when the log is not on disk)."""
    root = data_dir / "log"
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.is_dir() else 0
