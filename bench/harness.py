"""What every benchmark shares: the registry, the machine description, timing, the table, the JSON file, and
the separate virtualenv the Agent Lightning baseline runs in."""

from __future__ import annotations

import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from litstream.infra.broker import DEFAULT_HEAP_MB, KAFKA_VERSION, BrokerError, java_binary

# The registry: one line per benchmark, name -> module. A module defines `TITLE: str` and
# `run(ctx: Context) -> Report`; it is imported only when it runs.
BENCHMARKS: dict[str, str] = {
    "kafka_codec": "bench.kafka_codec",
    "broker": "bench.broker",
    "rollout_cycles": "bench.rollout_cycles",
    "timer_latency": "bench.timer_latency",
    "replay_rate": "bench.replay_rate",
    "span_ingest": "bench.span_ingest",
    "agent_loop": "bench.agent_loop",
    "report_queries": "bench.report_queries",
    "trainer": "bench.trainer",
    "policy_server": "bench.policy_server",
}

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"

# agentlightning's dependency tree cannot share the project's environment: huggingface-hub wants click>=8.4.2
# where faust-streaming wants click<8.4, and litellm, agentops and botocore pull rich<14, packaging<25 and
# python-dateutil<3 below what is installed. So its baseline runs in a virtualenv of its own.
AGL_REQUIREMENT = "agentlightning==0.3.0"
# OpenTelemetry as it was when 0.3.0 came out: from 1.45 the OTLP/HTTP exporter fixes its endpoint when it is built,
# which 0.3.0's LightningStoreOTLPExporter (it re-points the endpoint per rollout) does not expect.
AGL_CONSTRAINTS = ("opentelemetry-exporter-otlp<1.45", "opentelemetry-exporter-otlp-proto-http<1.45",
                   "opentelemetry-sdk<1.45")
_AGL_INSTALLED = " ".join((AGL_REQUIREMENT, *AGL_CONSTRAINTS))
AGL_VENV = Path(os.environ.get("LITSTREAM_AGL_VENV") or BENCH_DIR.parent / ".venv-agl")
AGL_SCRIPT = BENCH_DIR / "agl_reference.py"
_AGL_READY = ".litstream-bench-ready"  # written once the install and an import check passed


@dataclass
class Row:
    """One line of the table: a rate, or (with no rate) a note saying why there is none."""

    what: str
    msgs_per_s: float | None = None
    mb_per_s: float | None = None
    n: int | None = None
    note: str = ""
    samples_s: list[float] = field(default_factory=list)  # wall seconds of each repeat
    value: float | None = None  # a figure that is not a rate (e.g. CPU-ms per rollout); lower is better


@dataclass
class Report:
    rows: list[Row]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    quick: bool
    agl: bool
    console: Console

    def step(self, message: str) -> None:
        self.console.print(f"[dim]- {message}[/]")


# --- timing -------------------------------------------------------------------------------------------------


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of one call. Collects garbage first so that setup's garbage is not paid inside."""
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cpu_timed(fn: Callable[[], object]) -> float:
    """This thread's CPU seconds in one call (:func:`timed` otherwise): another process taking the core does not
    lengthen it, so timings of one process's work taken side by side compare on a busy machine."""
    gc.collect()
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def repeat(fn: Callable[[], object], repeats: int) -> list[float]:
    return [timed(fn) for _ in range(repeats)]


def rate_row(what: str, samples_s: list[float], n: int, nbytes: int | None = None, note: str = "") -> Row:
    """The median repeat's rate: robust to one repeat disturbed by a neighbour process."""
    median = statistics.median(samples_s)
    mb_per_s = nbytes / median / 1e6 if nbytes is not None else None
    return Row(what, n / median, mb_per_s, n, note, list(samples_s))


# --- the machine --------------------------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _cpu_quota() -> float | None:
    """The cgroup v2 CPU limit (cores), which containers set below the cores the kernel shows."""
    parts = _read("/sys/fs/cgroup/cpu.max").split()
    if len(parts) == 2 and parts[0] != "max":
        return int(parts[0]) / int(parts[1])
    return None


def _ram_gib() -> float:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def _git() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=BENCH_DIR,
                              capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], check=False, cwd=BENCH_DIR,
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _java() -> str | None:
    """The Java the embedded broker runs on, as ``java -version`` names it (e.g. "openjdk 17.0.15")."""
    try:
        out = subprocess.run([java_binary(), "-version"], check=False, capture_output=True, text=True,
                             timeout=30).stderr
    except (BrokerError, OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'^(\S+) version "([^"]+)"', out, re.MULTILINE)
    if found:
        return f"{found.group(1)} {found.group(2)}"
    return out.splitlines()[0] if out.strip() else None


def machine() -> dict[str, Any]:
    """What the numbers depend on, saved with them."""
    try:
        import confluent_kafka

        librdkafka: str | None = confluent_kafka.libversion()[0]
    except ImportError:
        librdkafka = None
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": affinity,
        "cpu_quota": _cpu_quota(),
        "ram_gib": round(_ram_gib(), 1),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "broker_heap_mb": DEFAULT_HEAP_MB,
        "versions": {
            "litstream": _version("litstream"),
            "git": _git(),
            "confluent-kafka": _version("confluent-kafka"),
            "librdkafka": librdkafka,
            "fastavro": _version("fastavro"),
            "pydantic": _version("pydantic"),
            "kafka": KAFKA_VERSION,
            "java": _java(),
        },
    }


def print_machine(console: Console, m: dict[str, Any]) -> None:
    v = m["versions"]
    quota = f", cgroup quota {m['cpu_quota']:g}" if m["cpu_quota"] else ""
    console.print(f"[bold]machine[/] {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable{quota}), "
                  f"{m['ram_gib']} GiB RAM, {m['os']}")
    console.print(f"[bold]python[/]  {m['python']}, OMP_NUM_THREADS={m['omp_num_threads']}, "
                  f"litstream {v['litstream']} (git {v['git'] or '?'})")
    console.print(f"[bold]clients[/] confluent-kafka {v['confluent-kafka']} (librdkafka {v['librdkafka']}), "
                  f"fastavro {v['fastavro']}, pydantic {v['pydantic']}")
    java = v["java"] or "(not found)"
    console.print(f"[bold]broker[/]  Apache Kafka {v['kafka']} (KRaft, one node), Java {java}, "
                  f"heap {m['broker_heap_mb']} MiB")


# --- output -------------------------------------------------------------------------------------------------


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_report(console: Console, title: str, report: Report) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("what")
    table.add_column("msgs/s", justify="right")
    table.add_column("MB/s", justify="right")
    table.add_column("n", justify="right")
    table.add_column("notes", overflow="fold")
    for row in report.rows:
        measured = row.msgs_per_s is not None or row.value is not None
        note = row.note if measured or not row.note else f"[yellow]{row.note}[/]"
        n = _num(row.n, 0) if row.n else ""
        rate = _num(row.msgs_per_s, 0) if row.value is None else f"({_num(row.value, 1)})"
        table.add_row(row.what, rate, _num(row.mb_per_s, 1), n, note)
    console.print(table)


def save(results_dir: Path, name: str, m: dict[str, Any], report: Report, *, quick: bool,
         elapsed_s: float) -> Path:
    """bench/results/<name>-<UTC timestamp>.json: the machine, the parameters, every row with its repeats."""
    now = datetime.now(UTC)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}-{now:%Y%m%dT%H%M%SZ}.json"
    suffix = 1
    while path.exists():  # two runs in one second (tests) must not overwrite each other
        path = results_dir / f"{name}-{now:%Y%m%dT%H%M%SZ}-{suffix}.json"
        suffix += 1
    doc = {"benchmark": name, "timestamp": now.isoformat(), "quick": quick, "elapsed_s": round(elapsed_s, 2),
           "machine": m, "params": report.params, "rows": [asdict(r) for r in report.rows]}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


# --- the Agent Lightning virtualenv -------------------------------------------------------------------------


def _agl_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    # litellm (imported by agentlightning) fetches a model price list over the network at import, unless told.
    env.update({"OMP_NUM_THREADS": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    return env


def _last_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and not ln.lstrip().startswith("WARNING")]
    errors = [ln for ln in lines if ln.startswith("ERROR") or "Error" in ln]
    return (errors or lines or ["no output"])[-1][:300]


def agl_python(console: Console) -> tuple[Path | None, str]:
    """The baseline venv's python, created on first use; or None and the reason it cannot be had."""
    python = AGL_VENV / "bin" / "python"
    ready = AGL_VENV / _AGL_READY
    if python.exists() and ready.exists() and ready.read_text().strip() == _AGL_INSTALLED:
        return python, ""
    console.print(f"[bold yellow]Creating {AGL_VENV} with {AGL_REQUIREMENT} for the Agent Lightning baseline "
                  "(once; this takes a minute or more) ...[/]")
    steps: list[list[str]] = []
    if not python.exists():
        # The project's own interpreter, so that both sides run the same Python version.
        steps.append([sys.executable, "-m", "venv", str(AGL_VENV)])
    steps.append([str(python), "-m", "pip", "install", "--quiet", AGL_REQUIREMENT, *AGL_CONSTRAINTS])
    steps.append([str(python), "-c", "import agentlightning.store.memory, agentlightning.types"])
    for cmd in steps:
        shown = " ".join(Path(cmd[0]).name if i == 0 else c for i, c in enumerate(cmd))
        console.print(f"[dim]  $ {shown}[/]")
        try:
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=1800,
                                  env=_agl_env())
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"`{shown}`: {exc}"
        if proc.returncode != 0:
            return None, f"`{shown}` failed: {_last_error(proc.stderr + proc.stdout)}"
    ready.write_text(_AGL_INSTALLED + "\n")
    return python, ""


def run_agl_reference(config: dict[str, Any], console: Console, timeout: float = 600.0,
                      show_progress: bool = False) -> dict[str, Any] | str:
    """Run bench/agl_reference.py in the baseline venv; its result dict, or the reason there is none. With
    ``show_progress`` its standard error goes to this process's as it comes (a long run's progress)."""
    python, reason = agl_python(console)
    if python is None:
        return reason
    try:
        proc = subprocess.run([str(python), str(AGL_SCRIPT)], check=False, input=json.dumps(config),
                              stdout=subprocess.PIPE, stderr=None if show_progress else subprocess.PIPE,
                              text=True, timeout=timeout, env=_agl_env())
    except subprocess.TimeoutExpired:
        return f"the Agent Lightning baseline did not finish within {timeout:.0f}s"
    # The result is the last JSON line: the libraries it imports may print too.
    for line in reversed(proc.stdout.splitlines()):
        if proc.returncode == 0 and line.startswith("{"):
            try:
                return dict(json.loads(line))
            except json.JSONDecodeError:
                break
    why = _last_error((proc.stderr or "") + proc.stdout)
    return f"the Agent Lightning baseline failed (exit {proc.returncode}): {why}"
