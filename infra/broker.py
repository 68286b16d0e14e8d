"""The embedded broker: Apache Kafka in KRaft mode (one process, broker and controller combined), run from the
jars ``make install`` resolves from Maven Central (``infra/pom.xml``).

Used by ``litstream up``/``demo``/``train``, ``Trainer.fit``, the tests and the benchmarks. It listens on 127.0.0.1
only, on a free port (the one it had last time, when that is still free), keeps its log under a directory of the
caller's (``<data_dir>/kafka`` by default: durable across restarts) and is the same product and version as the
production stack's broker (docker-compose.yml). :class:`KafkaBroker` is one node; :class:`KafkaCluster` several on
loopback ports (the three-broker fault tests).

``python -m litstream.infra.broker install`` resolves the jars (online once, offline afterwards) and prints
where they are; ``make install`` runs it.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from .processes import stop_process, with_parent_death_signal

KAFKA_VERSION = "4.4.0"  # infra/pom.xml and docker-compose.yml's image tag name the same version
MIN_JAVA = 17  # Kafka 4.x brokers need Java 17 or newer
# The broker's heap, fixed (-Xms = -Xmx): measured in docs/embedded-stack.md, enough for the soak's 1M spans.
DEFAULT_HEAP_MB = 384
# Below this much free space where the log is kept, the broker is not started (and `status` warns): Kafka stops
# with a storage error when a segment cannot be written, and every producer then retries until it times out.
MIN_FREE_BYTES = 256 * 1024 * 1024


class BrokerError(RuntimeError):
    """The broker cannot run: no Java, no jars, its port taken, a damaged log dir... one line naming the cause."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether a server could listen on ``port``. SO_REUSEADDR as the JVM sets it: the connections a killed broker
    leaves in TIME_WAIT on its ports do not stop it from listening there again, only a live listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# --- Java and the jars -------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` or the ``java`` on PATH, checked to be Java 17 or newer (once per process)."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else shutil.which("java")
    if java is None:
        raise BrokerError(f"the embedded Kafka broker needs Java {MIN_JAVA} or newer and none was found: install it "
                          "(Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    major = java_major_version(java)
    if major < MIN_JAVA:
        raise BrokerError(f"{java} is Java {major}; Apache Kafka {KAFKA_VERSION} needs Java {MIN_JAVA} or newer "
                          "(set JAVA_HOME to a newer one)")
    return java


def java_major_version(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not found:
        return 0
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def pom_path() -> Path:
    return Path(str(resources.files("litstream.infra").joinpath("pom.xml")))


def log4j_config_path() -> Path:
    return Path(str(resources.files("litstream.infra").joinpath("kafka-log4j2.properties")))


def classpath_file() -> Path:
    """Where the resolved classpath is kept: beside the virtualenv (or LITSTREAM_KAFKA_CLASSPATH)."""
    named = os.environ.get("LITSTREAM_KAFKA_CLASSPATH")
    return Path(named) if named else Path(sys.prefix) / "share" / "litstream" / f"kafka-{KAFKA_VERSION}.classpath"


def kafka_classpath(resolve: bool = True) -> str:
    """The broker's classpath; resolved with Maven when it was not yet (or a jar went missing)."""
    cached = classpath_file()
    if cached.exists():
        jars = cached.read_text().strip()
        if jars and all(Path(j).exists() for j in jars.split(os.pathsep)):
            return jars
    if not resolve:
        raise BrokerError("the embedded Kafka broker's jars are not resolved: run `make install` (or "
                          "`python -m litstream.infra.broker install`)")
    return resolve_jars(cached)


def resolve_jars(target: Path) -> str:
    """Resolve ``infra/pom.xml`` into the local Maven repository (offline when every jar is there already) and
    write the classpath to ``target``."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("the embedded Kafka broker's jars come from Maven Central through Maven, and `mvn` was not "
                          "found: install it (Debian: apt-get install maven), then run `make install`")
    target.parent.mkdir(parents=True, exist_ok=True)
    base = [mvn, "-B", "-q", "-f", str(pom_path()), "dependency:build-classpath", f"-Dmdep.outputFile={target}"]
    for offline in (True, False):
        done = subprocess.run(base + (["-o"] if offline else []), capture_output=True, text=True)
        if done.returncode == 0 and target.exists():
            return target.read_text().strip()
    said = [line.strip() for line in (done.stdout + done.stderr).splitlines() if "ERROR" in line or "FATAL" in line]
    raise BrokerError(f"Maven could not resolve org.apache.kafka:kafka_2.13:{KAFKA_VERSION}: "
                      + (said[0][:400] if said else f"mvn exited with code {done.returncode}"))


def class_archive_file() -> Path:
    """The broker's class-data archive (AppCDS), beside its classpath: one per Java version, since a JVM takes only
    an archive that it dumped itself."""
    major = java_major_version(java_binary())
    return classpath_file().with_name(f"kafka-{KAFKA_VERSION}.java{major}.jsa")


def build_class_archive() -> Path:
    """Start a throwaway broker once with ``-XX:ArchiveClassesAtExit`` and stop it cleanly: the classes it loaded
    are dumped to an archive that later starts map instead of loading and verifying them again (a start on two
    cores went from ~3.3 s to ~1.6 s)."""
    target = class_archive_file()
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    broker = KafkaBroker(jvm_flags=[f"-XX:ArchiveClassesAtExit={partial}"], use_class_archive=False)
    try:
        broker.start()
    finally:
        broker.stop()
    if not partial.exists():
        raise BrokerError(f"the JVM dumped no class archive to {partial}")
    partial.replace(target)
    return target


def cluster_id() -> str:
    """A new KRaft cluster id: a UUID in URL-safe base64 without padding."""
    while True:  # one in 64 starts with "-", which StorageTool's argument parser reads as an option
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


# --- One broker --------------------------------------------------------------------------------------------------

# A single-node cluster's internal topics need replication 1; the group and transaction coordinators' topics few
# partitions (each is a log the broker opens); a new group starts at once; fewer threads on a 2-core machine; the
# log cleaner on (state topics and changelogs are compacted) with a small dedupe buffer, which comes out of the heap.
SINGLE_NODE: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "share.coordinator.state.topic.num.partitions": "4",
}
SMALL_MACHINE: dict[str, str] = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "background.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
    # Segments of 64 MiB instead of 1 GiB: retention and compaction act on closed segments, so on a small stack
    # they act at all; the index files are preallocated per segment, at 1 MiB instead of 10.
    "log.segment.bytes": str(64 * 1024 * 1024),
    "log.index.size.max.bytes": str(1024 * 1024),
    "auto.create.topics.enable": "false",
    # A node restarted after a SIGKILL waits until the controller fences its earlier incarnation: 9 s by default,
    # 3 s here (a start after SIGKILL took 13.6 s, 5.1 s at 2 s). Heartbeats every 0.5 s keep a live node well
    # inside it on a loaded machine.
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
}
JVM_FLAGS = ["-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError", "-XX:MaxDirectMemorySize=128m",
             "-Djava.awt.headless=true", "-Dfile.encoding=UTF-8"]
# What a broker that exits at start prints, read back into the one line `up` shows.
_KNOWN_FAILURES = (
    (re.compile(r"Address already in use|BindException"), "its port is taken"),
    (re.compile(r"No space left on device"), "the disk is full"),
    (re.compile(r"InconsistentClusterIdException|Invalid cluster.id|does not match"),
     "its log dir belongs to another cluster"),
    (re.compile(r"No `meta.properties` found|NoSuchFileException|meta.properties"),
     "its log dir is not formatted or was damaged"),
    (re.compile(r"CorruptRecordException|KafkaStorageException|InvalidOffsetException"),
     "its log dir is damaged"),
    (re.compile(r"UnsupportedClassVersionError"), f"the Java found is older than {MIN_JAVA}"),
    (re.compile(r"OutOfMemoryError"), "it ran out of heap (LITSTREAM_BROKER_HEAP_MB)"),
)


@dataclass
class Listener:
    """One client-facing listener: its security protocol and the extra broker properties it needs (SASL, TLS)."""

    protocol: str = "PLAINTEXT"  # PLAINTEXT | SASL_PLAINTEXT | SSL | SASL_SSL
    properties: dict[str, str] = field(default_factory=dict)


class ServerProcess:
    """A local server the stack runs as a child process: alive, stopped (terminate, then kill) or killed."""

    proc: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class KafkaBroker(ServerProcess):
    """One Apache Kafka node in KRaft combined mode, its log under ``log_dir``.

    The first start formats the log dir (``kafka.tools.StorageTool``); later starts find it formatted and resume
    the log. ``log_dir=None`` gives a throwaway directory, removed when the broker stops. Several nodes of one
    cluster share ``voters`` (node id -> controller port) and ``cluster``; :class:`KafkaCluster` builds them."""

    def __init__(self, log_dir: Path | None = None, port: int | None = None, *, node_id: int = 1,
                 controller_port: int | None = None, voters: Mapping[int, int] | None = None,
                 cluster: str | None = None, heap_mb: int = DEFAULT_HEAP_MB, log_path: Path | None = None,
                 listener: Listener | None = None, properties: Mapping[str, str] | None = None,
                 client_config: Mapping[str, Any] | None = None, format_args: list[str] | None = None,
                 jvm_flags: list[str] | None = None, use_class_archive: bool = True) -> None:
        self.ephemeral = log_dir is None
        self.log_dir = log_dir if log_dir is not None else Path(_mkdtemp())
        self.node_id = node_id
        remembered = remembered_ports(self.log_dir)
        self.port = port or _reuse(remembered.get("port")) or free_port()
        self.controller_port = controller_port or _reuse(remembered.get("controller_port")) or free_port()
        self.voters = dict(voters) if voters else {node_id: self.controller_port}
        self.cluster = cluster
        self.heap_mb = heap_mb
        self.log_path = log_path
        self.listener = listener or Listener()
        self.properties = dict(properties or {})
        self.client_config = dict(client_config or {})  # what a client needs to talk to it (SASL, TLS)
        self.format_args = list(format_args or [])  # e.g. SCRAM credentials: --add-scram ...
        self.jvm_flags = list(jvm_flags or [])
        self.use_class_archive = use_class_archive
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def storage(self) -> str:
        return "ephemeral" if self.ephemeral else str(self.log_dir)

    def server_properties(self) -> dict[str, str]:
        protocol = self.listener.protocol
        name = "CLIENT"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": ",".join(f"{n}@127.0.0.1:{p}" for n, p in sorted(self.voters.items())),
            "listeners": f"{name}://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"{name}://127.0.0.1:{self.port}",
            "listener.security.protocol.map": f"{name}:{protocol},CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": name,
            "log.dirs": str(self.log_dir / "data"),
            **SMALL_MACHINE,
            **(SINGLE_NODE if len(self.voters) == 1 else {}),
            **{k.replace("{listener}", name.lower()): v for k, v in self.listener.properties.items()},
            **self.properties,
        }
        return props

    def _write_properties(self) -> Path:
        path = self.log_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.server_properties().items()))
        return path

    def _java(self, main: str, *args: str, heap: list[str]) -> list[str]:
        return [java_binary(), *heap, *JVM_FLAGS, f"-Dlog4j2.configurationFile={log4j_config_path()}",
                "-cp", kafka_classpath(), main, *args]

    def _class_archive(self) -> list[str]:
        """The class-data archive's flags when ``make install`` built one (a JVM that cannot use it starts
        without it, silently)."""
        archive = class_archive_file()
        if not self.use_class_archive or not archive.exists():
            return []
        return [f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]

    def formatted(self) -> bool:
        return (self.log_dir / "data" / "meta.properties").exists()

    def format(self) -> None:
        """Format the log dir for this node (once: a formatted dir is left as it is)."""
        if self.formatted():
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        props = self._write_properties()
        cid = self.cluster or cluster_id()
        done = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cid, "-c", str(props),
                                         *self.format_args, heap=["-Xmx128m", *self._class_archive()]),
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise BrokerError(f"formatting the broker's log dir {self.log_dir} failed: "
                              + " ".join((done.stdout + done.stderr).split()[-30:]))

    def start(self, timeout: float = 60.0) -> KafkaBroker:
        self.format()
        self._start_process()
        self.wait_answering(timeout)
        return self

    def _start_process(self) -> None:
        check_free_space(self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for port in (self.port, self.controller_port):
            if not port_free(port):
                raise BrokerError(f"the broker's port {port} on 127.0.0.1 is taken by another process")
        props = self._write_properties()
        (self.log_dir / "ports.json").write_text(json.dumps({"port": self.port,
                                                             "controller_port": self.controller_port}))
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 (the child owns it)
        heap = [f"-Xms{self.heap_mb}m", f"-Xmx{self.heap_mb}m", *self.jvm_flags, *self._class_archive()]
        # The JVM stops with the process that started it (a SIGKILLed `litstream up` leaves no broker behind).
        cmd = with_parent_death_signal(self._java("kafka.Kafka", str(props), heap=heap))
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if not isinstance(out, int):  # the file, not DEVNULL
            out.close()

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0, **self.client_config})

    def wait_answering(self, timeout: float) -> None:
        """Until the broker answers a metadata request (with its own client config)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(self.failure(f"exited with code {self.proc.returncode}"))
            try:
                meta = self.admin().list_topics(timeout=1.0)
                if meta.brokers:
                    return
            except KafkaException:
                pass
            time.sleep(0.1)
        self.stop()
        raise BrokerError(self.failure(f"did not answer on {self.bootstrap} within {timeout:.0f}s"))

    def known_cause(self) -> str | None:
        """Why it stopped, when its log names a cause that a restart would not cure (a full disk, a taken port...)."""
        tail = _tail(self.log_path)
        return next((why for pattern, why in _KNOWN_FAILURES if pattern.search(tail)), None)

    def failure(self, what: str) -> str:
        """One line: what happened, the likely cause read from its log, and where the log is."""
        cause = self.known_cause()
        return (f"the Kafka broker {what}" + (f": {cause}" if cause else "")
                + (f"; see {self.log_path}" if self.log_path else ""))

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown: the log is closed cleanly), then SIGKILL after ``timeout``."""
        super().stop(timeout)
        if self.ephemeral:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def remembered_ports(log_dir: Path) -> dict[str, int]:
    """The ports a node kept its log under ``log_dir`` last listened on (empty when it never started)."""
    try:
        return {k: int(v) for k, v in json.loads((log_dir / "ports.json").read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _reuse(port: int | None) -> int | None:
    """A port the broker had before, if it is still free (so clients and the stack file keep their address)."""
    return port if port and port_free(port) else None


def _mkdtemp() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="litstream-kafka-")


def _tail(path: Path | None, size: int = 32 * 1024) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - size))
        return f.read().decode(errors="replace")


def replicated_defaults(size: int) -> dict[str, str]:
    """Broker defaults for a cluster of ``size`` nodes: every topic on up to three replicas, a write (acks=all)
    acknowledged once two have it. The project's topics take the default replication (``create_topics`` asks
    for -1); the internal ones (group offsets, transaction state, share groups) are set here. With three nodes,
    one may be lost without losing an acknowledged record or stopping writes."""
    rf = min(3, size)
    isr = str(max(1, rf - 1))
    return {
        "default.replication.factor": str(rf),
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": str(rf),
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": isr,
        "share.coordinator.state.topic.num.partitions": "4",
    }


class KafkaCluster:
    """``size`` Kafka nodes on loopback ports, each broker and controller (a static quorum of all of them), one
    log dir each under ``root/node-<id>``, their output in ``logs/broker-<id>.log`` (``logs`` defaults to
    ``root``). Broker defaults from :func:`replicated_defaults`, then ``properties``.

    A node can be killed and started again on its log dir (``kill``, ``start_node``): it rejoins the quorum and
    its replicas catch up from the leaders."""

    def __init__(self, root: Path, size: int = 3, heap_mb: int = 256, properties: Mapping[str, str] | None = None,
                 logs: Path | None = None) -> None:
        ids = range(1, size + 1)
        # A cluster started again on its root keeps its ports when they are free (the voters' addresses too).
        voters = {n: _reuse(remembered_ports(root / f"node-{n}").get("controller_port")) or free_port() for n in ids}
        cid = _cluster_id_of(root, ids) or cluster_id()
        props = {**replicated_defaults(size), **(properties or {})}
        self.nodes = {n: KafkaBroker(root / f"node-{n}", node_id=n, controller_port=voters[n], voters=voters,
                                     cluster=cid, heap_mb=heap_mb, properties=props,
                                     log_path=(logs or root) / f"broker-{n}.log") for n in ids}

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes.values())

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        """Format every node (the same cluster id), start them all, then wait for each to answer: a node answers
        only once a majority of the controllers is up, so they cannot be started one after the other."""
        try:
            for node in self.nodes.values():
                node.format()
            for node in self.nodes.values():
                node._start_process()
            deadline = time.monotonic() + timeout
            for node in self.nodes.values():
                node.wait_answering(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, node_id: int, timeout: float = 120.0) -> KafkaBroker:
        """Start one node again on its log dir (the others running): it rejoins and catches up."""
        return self.nodes[node_id].start(timeout)

    def kill(self, node_id: int) -> None:
        """SIGKILL one node: no controlled shutdown, its leaderships move once the controller fences it."""
        self.nodes[node_id].kill()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to every node at once: stopped one by one, the last ones would wait out their controlled
        shutdown with the quorum already gone."""
        for node in self.nodes.values():
            if node.alive() and node.proc is not None:
                node.proc.terminate()
        for node in self.nodes.values():
            node.stop(timeout)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cluster_id_of(root: Path, ids: range) -> str | None:
    """The cluster id a node under ``root`` was formatted with, if any (the others must get the same)."""
    for n in ids:
        meta = root / f"node-{n}" / "data" / "meta.properties"
        if meta.exists():
            found = re.search(r"^cluster\.id=(\S+)$", meta.read_text(), re.MULTILINE)
            if found:
                return found.group(1)
    return None


def check_free_space(path: Path, minimum: int = MIN_FREE_BYTES) -> None:
    """A clear error when the disk that holds the log is (nearly) full."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < minimum:
        raise BrokerError(f"only {free // 2**20} MB free on the disk of {path} (the broker's log needs at least "
                          f"{minimum // 2**20} MB): free some space, move LITSTREAM_DATA_DIR, or shorten the "
                          "topics' retention (docs/durable-log.md)")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["install"]:
        print("usage: python -m litstream.infra.broker install", file=sys.stderr)
        return 2
    try:
        java_major = java_major_version(java_binary())
        jars = kafka_classpath()
        print(f"Apache Kafka {KAFKA_VERSION}: {len(jars.split(os.pathsep))} jars resolved (Java {java_major}); "
              f"classpath in {classpath_file()}")
        if not class_archive_file().exists():
            print(f"class-data archive: {build_class_archive()}")
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
