"""The benchmark harness runs end to end on the embedded broker (quick sizes, no Agent Lightning venv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from litstream.infra.broker import KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[1]  # `python -m bench` runs from a checkout's root: bench is not installed


def quick_bench(name: str, results: Path) -> Path:
    """Run one benchmark's quick size without the reference, as `make bench` would; returns its JSON file."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--only", name, "--quick", "--no-agl",
         "--results-dir", str(results)],
        check=False, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [path] = results.glob(f"{name}-*.json")
    return path

def test_kafka_codec_quick(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "kafka_codec", "--quick", "--no-agl",
         "--results-dir", str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = list(tmp_path.glob("kafka_codec-*.json"))
    assert len(files) == 1, proc.stdout[-3000:]
    doc = json.loads(files[0].read_text())
    assert doc["benchmark"] == "kafka_codec" and doc["quick"] is True
    rows = {row["what"]: row for row in doc["rows"]}
    for what in ("codec encode SpanRecorded", "codec decode RolloutEnqueued", "fastavro decode RolloutEnqueued",
                 "codec decode, the type furthest from fastavro", "fastavro decode, the type furthest from the codec",
                 "codec decode records, the type furthest from fastavro",
                 "fastavro encode, the type furthest from the codec records",
                 "broker produce (Apache Kafka, 4 partitions)", "broker consume (Apache Kafka, 4 partitions)",
                 "broker consume via infra.kafka.read_to_end", "EventProducer.send (encode+produce)"):
        assert rows[what]["msgs_per_s"] > 0, what
    assert rows["agentlightning 0.3.0 baseline"]["note"] == "skipped (--no-agl)"
    assert doc["machine"]["versions"]["fastavro"] and doc["machine"]["versions"]["kafka"] == KAFKA_VERSION
    assert doc["machine"]["versions"]["java"]


@pytest.mark.slow  # ~1 minute: three JVM starts and a format
def test_broker_benchmark_quick(tmp_path: Path) -> None:
    """The embedded broker's own cost: start times, RSS, idle CPU, produce/consume, records kept."""
    path = quick_bench("broker", tmp_path)
    costs = json.loads(path.read_text())["params"]["costs"]
    assert all(len(costs["start_s"][kind]) == 1 and costs["start_s"][kind][0] > 0
               for kind in ("fresh", "restarted", "killed"))
    assert costs["kept"] == {"restarted": costs["records"], "killed": costs["records"]}
    assert 0 < costs["rss_mb"]["idle"] and 0 < costs["idle_cpu_s"] < costs["total_cpu_s"]
    assert costs["produce_s"] > 0 and costs["consume_s"] > 0


@pytest.mark.slow  # 45 s; `make bench` runs these benchmarks at full size
def test_lifecycle_benchmarks_quick(tmp_path: Path) -> None:
    """rollout_cycles, timer_latency, replay_rate and span_ingest on the real pipeline, small sizes, in one run."""
    names = ("rollout_cycles", "timer_latency", "replay_rate", "span_ingest")
    only = [arg for name in names for arg in ("--only", name)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *only, "--quick", "--no-agl", "--results-dir", str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    docs = {}
    for name in names:
        files = list(tmp_path.glob(f"{name}-*.json"))
        assert len(files) == 1, (name, proc.stdout[-3000:])
        docs[name] = json.loads(files[0].read_text())
        assert docs[name]["benchmark"] == name and docs[name]["quick"] is True
        rows = {row["what"]: row for row in docs[name]["rows"]}
        assert rows["agentlightning 0.3.0 baseline"]["note"] == "skipped (--no-agl)"

    cycles = {row["what"]: row for row in docs["rollout_cycles"]["rows"]}
    for what in ("litstream cycles, 1 call in flight", "litstream cycles, 64 calls in flight",
                 "litstream enqueue_many_rollouts(64)"):
        assert cycles[what]["msgs_per_s"] > 0, what
    phases = docs["rollout_cycles"]["params"]["litstream_phases_s"]
    assert set(phases["sequential"]) == {"total", "enqueue", "dequeue", "update", "wait"}

    timers = docs["timer_latency"]
    late = timers["params"]["litstream_late_s"]
    assert len(late["fired"]) == len(late["visible"]) == timers["params"]["m"]
    summary = timers["params"]["summary_ms"]["litstream timeout visible (LitStore view)"]
    assert 0 <= summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    visible = {row["what"]: row for row in timers["rows"]}["litstream timeout visible (LitStore view)"]
    assert visible["value"] == summary["p99_ms"]  # the summary's timer row

    replay = {row["what"]: row for row in docs["replay_rate"]["rows"]}
    for what in ("litstream replay (read rollout-events + decode + fold)", "litstream decode + fold, in memory",
                 "litstream fold_events (the pure fold)"):
        assert replay[what]["msgs_per_s"] > 0 and replay[what]["n"] == docs["replay_rate"]["params"]["events"]

    spans = docs["span_ingest"]
    ingest = {row["what"]: row for row in spans["rows"]}
    for what, n in (("litstream SDK exporter (KafkaSpanProcessor): span end", "sdk_n"),
                    ("litstream SDK exporter: durable on Kafka (incl. force_flush)", "sdk_n"),
                    ("litstream SDK exporter: visible in ClickHouse", "sdk_n"),
                    ("litstream OTLP/HTTP exporter -> gateway /v1/traces: force_flush returned", "otlp_n"),
                    ("litstream OTLP/HTTP: visible in ClickHouse", "otlp_n")):
        assert ingest[what]["msgs_per_s"] > 0 and ingest[what]["n"] == spans["params"][n], what
    assert spans["params"]["litstream_s"]["sdk"]["stats"]["dropped_queue_full"] == 0
    rest = [row for what, row in ingest.items() if what.startswith("litstream REST add_span")]
    assert len(rest) == 2 and all(row["note"].startswith("skipped (--no-agl") for row in rest)


@pytest.mark.slow  # 1.5 minutes; the soak is a benchmark, run on its own
def test_soak_tiny(tmp_path: Path) -> None:
    """The soak at a tiny size: every group's lag back to zero, nothing lost, RSS sampled per process, a PNG."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--rollouts", "100", "--runners", "2", "--concurrency", "4",
         "--partitions", "4", "--in-flight", "100", "--sample-s", "2", "--results-dir", str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = list(tmp_path.glob("soak-*.json"))
    assert len(files) == 1 and list(tmp_path.glob("soak-*.png")), proc.stdout[-3000:]
    params = json.loads(files[0].read_text())["params"]
    assert not any(params["lost"].values()), params["lost"]
    assert all(v == 0 for per in params["final_lag"].values() for v in per.values()), params["final_lag"]
    assert set(params["final_lag"]) == {"lifecycle", "span-sink", "triplets", "runners"}
    processes = {m["process"] for m in params["memory"]}
    assert {"broker", "lifecycle", "span-sink", "triplets", "runner-0", "runner-1"} <= processes
    assert all(m["peak_mb"] > 0 for m in params["memory"])
    assert params["broker_storage"] == "durable" and params["phases_s"]["broker_start"] > 0
    assert len(params["rates_per_tenth"]) == 10 and len(params["flatness"]["quarters"]) == 4
    assert params["bounds"]["broker_peak_mb"] > 0 and params["bounds"]["python_peak_mb"] > 0


@pytest.mark.slow  # ~40 s; `make bench` runs it at full size
def test_policy_server_benchmark_quick(tmp_path: Path) -> None:
    path = quick_bench("policy_server", tmp_path)
    doc = json.loads(path.read_text())
    assert doc["params"]["overhead_p50_ms"] > -1000 and doc["params"]["reserve_p50_ms"] > 0
    rows = {row["what"]: row for row in doc["rows"]}
    assert rows["server, 16 clients"]["msgs_per_s"] > 0 and rows["server, 1 client"]["msgs_per_s"] > 0



def test_cpus_option_reads_cpu_lists_and_refuses_what_is_not_here() -> None:
    """``--cpus`` takes 0, 0,1 or 0-1 (the CPUs every process of the run is pinned to); a CPU this machine lacks
    is a usage error, not a run on every core."""
    import argparse
    import os

    sys.path.insert(0, str(ROOT))
    from bench.__main__ import cpu_list

    here = sorted(os.sched_getaffinity(0))
    assert cpu_list(str(here[0])) == {here[0]}
    if here == list(range(here[0], here[-1] + 1)):
        assert cpu_list(f"{here[0]}-{here[-1]}") == set(here)
    with pytest.raises(argparse.ArgumentTypeError, match="not a CPU list"):
        cpu_list("first")
    bad = subprocess.run([sys.executable, "-m", "bench", "--cpus", "4096"], check=False, capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "not available here" in bad.stderr


def test_the_cpu_of_a_process_tree_counts_its_children() -> None:
    """What the agent loop's CPU-ms per rollout reads: a child's CPU counts toward the tree it belongs to."""
    from bench.agl_reference import tree_cpu_s

    burn = "import time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\ntime.sleep(30)"
    before = tree_cpu_s([os.getpid()])
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        assert tree_cpu_s([os.getpid()]) - before >= 0.25  # the child's 0.3 s, in the parent's tree
        assert tree_cpu_s([child.pid]) >= 0.25
    finally:
        child.kill()
        child.wait()


def test_the_memory_of_a_process_tree_counts_its_children() -> None:
    """What the growth table's memory reads: a child's resident memory counts toward the tree it belongs to."""
    from bench.agl_reference import tree_rss_mib

    hold = "b = bytearray(200 * 2**20)\nprint('done', flush=True)\nimport time\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        assert tree_rss_mib([child.pid]) >= 190
        assert tree_rss_mib([os.getpid()]) - tree_rss_mib([child.pid]) > 0  # the parent's own, and the child's
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow  # ~2 minutes; the growth table is a benchmark, run on its own
def test_growth_tiny(tmp_path: Path) -> None:
    """The growth run at a tiny size, both sides: four quarters each, every process's memory, the reads at the
    start and the end, and the Markdown table."""
    proc = subprocess.run([sys.executable, "-m", "bench.growth", "--rollouts", "80", "--results-dir", str(tmp_path)],
                          check=False, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(next(tmp_path.glob("growth-*.json")).read_text())
    ours = doc["sides"]["litstream"]["quarters"]
    assert len(ours) == 4 and all(q["rollouts"] == 20 for q in ours)
    assert {"broker", "lifecycle", "span-sink", "gateway"} <= set(ours[0]["rss_mib"])
    assert ours[0]["reads"]["query_spans"]["n"] == 20 and "reads" in ours[3]
    assert len(doc["sides"]) == 2 and "| litstream: rollouts/s |" in doc["markdown"]


def _one_side(rate: float, rss: float) -> dict[str, Any]:
    reads = {"get_rollout_by_id": {"p50_ms": 1.0}, "query_spans": {"p50_ms": 2.0}}
    return {"quarters": [{"rollouts": 100, "wall_s": 100 / rate, "rss_mib": {"server": rss}, "reads": reads}
                         for _ in range(4)]}


def test_growth_sides_run_apart_print_as_one_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A growth run longer than one sitting runs a side at a time; ``--merge`` prints their one table."""
    from bench.growth import main

    ours, theirs = tmp_path / "ours.json", tmp_path / "theirs.json"
    ours.write_text(json.dumps({"sides": {"litstream": _one_side(19.0, 300)}}))
    theirs.write_text(json.dumps({"sides": {"agentlightning 0.3.0": _one_side(14.0, 1600)}}))
    assert main(["--merge", str(ours), str(theirs)]) == 0
    table = capsys.readouterr().out
    assert "| litstream: rollouts/s | 19.0 | 19.0 | 19.0 | 19.0 |" in table
    assert "| agentlightning 0.3.0: server RSS (MiB) | 1,600 |" in table


def test_the_summary_holds_the_timer_to_its_bound_in_ms() -> None:
    """The timer row: litstream's p99 past the deadline against an absolute bound, the reference's beside it."""
    from bench.harness import Report, Row
    from bench.summary import summary

    rows = [Row("litstream timeout visible (LitStore view)", value=35.0),
            Row("agentlightning 0.3.0 InMemory, scan_debounce_seconds=0", value=64.0)]
    (line,) = summary({"timer_latency": Report(rows)})
    assert (line.litstream, line.reference, line.target, line.met) == (35.0, 64.0, "<= 50 ms", True)
    (late,) = summary({"timer_latency": Report([Row("litstream timeout visible (LitStore view)", value=51.0)])})
    assert (late.reference, late.met) == (None, False)
