"""Agent Lightning 0.3.0's own LightningStoreClient, unchanged, against litstream's gateway over HTTP.

The client runs in the Agent Lightning virtualenv (its dependencies conflict with Faust's), which `make test` makes
before the suite starts (`make baseline`); otherwise the benchmark harness makes it here, on first use.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from bench.harness import _agl_env, agl_python
from litstream.app.stack import Stack
from litstream.infra.broker import free_port
from litstream.infra.settings import Settings

SCRIPT = Path(__file__).parent / "agl_client_script.py"


@pytest.fixture(scope="session")
def agl() -> Path:
    python, reason = agl_python(Console(stderr=True))
    assert python is not None, f"the Agent Lightning virtualenv could not be made: {reason}"
    return python


@pytest.fixture
def gateway(settings: Settings) -> Iterator[str]:
    with Stack(settings) as s:
        yield s.start_store(free_port())


def test_stock_client_against_the_gateway(agl: Path, gateway: str) -> None:
    proc = subprocess.run([str(agl), str(SCRIPT), gateway], capture_output=True, text=True, timeout=300,
                          env=_agl_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["resources_version"] == 1 and out["resources_updated_version"] == 2
    assert out["latest_resources_is_updated"] and out["stamped_resources"]
    assert out["enqueued_status"] == "queuing"
    assert out["dequeued"] and out["attempt_status"] == "preparing"
    assert out["span_added"] and out["duplicate_span_is_none"]
    assert out["spans"] == [["agentlightning.annotation", 1, 1.0]]
    assert out["attempt_after"] == "succeeded" and out["waited"] == ["succeeded"]
    assert out["unknown_rollout_is_none"] and out["got_rollout_has_attempt"]
    assert out["query_total"] == 1 and out["attempts"] == ["succeeded"]
    assert out["started_status"] == "preparing" and out["second_attempt_seq"] == 2 and out["metadata_updated"]
    assert out["finished_again"] == ["succeeded", "succeeded", True]  # a finished rollout's own status: a no-op
    assert out["worker_after_start"] == ["busy", True] and out["worker_after_attempt"] is True
    assert out["spans_by_parent"] == 1
    assert out["worker_stats"] == {"cpu": 0.5}
    assert out["workers"] == ["agl-worker", "agl-worker-2", "agl-worker-3"]
    assert out["total_rollouts"] == 2 and out["total_spans"] == 1
    assert sys.version_info >= (3, 11)


def test_stock_runner_with_its_tracer_against_the_gateway(agl: Path, gateway: str) -> None:
    script = Path(__file__).parent / "agl_runner_script.py"
    proc = subprocess.run([str(agl), str(script), gateway, "4"], capture_output=True, text=True, timeout=300,
                          env=_agl_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["statuses"] == ["succeeded"] * 4
    assert out["rewards"] == [1.0, 0.0, 1.0, 0.0]
    for names in out["span_names"]:  # the tracer's spans arrived over OTLP, the reward over REST
        assert "agentlightning.annotation" in names and "agentlightning.operation" in names


CASES = Path(__file__).parent / "agl_compat_cases_script.py"


def _cases(agl: Path, target: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(agl), str(CASES), target], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_agl_env())


def _observed(proc: subprocess.Popen[str]) -> dict:
    try:
        out, err = proc.communicate(timeout=400)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-4000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.timeout(600)  # two runs of the stock client, the reference's beside the gateway's
def test_stock_client_cases_match_the_reference(agl: Path, gateway: str) -> None:
    """The same calls through the stock client against Agent Lightning's own server and against the gateway: a span
    starts, revives and beats its attempt; the queue is first in, first out; start_attempt reopens a succeeded
    rollout; update_rollout and update_attempt of a finished rollout are taken, the rollout following its newest
    attempt; a requeued rollout is dequeued at once; an attempt goes unresponsive on its own; span ids are any
    string and sequence id 0 is stored; a heartbeat without stats keeps them. The same observations on both, but
    for the two differences docs/agl-and-otlp.md gives."""
    reference_run = _cases(agl, "reference")  # its own server, in its own process: both run at once
    try:
        ours = _observed(_cases(agl, gateway))
    finally:
        reference = _observed(reference_run)
    ours_differ, reference_differs = ours.pop("differences"), reference.pop("differences")
    ours_timer, reference_timer = ours.pop("unresponsive_on_its_own"), reference.pop("unresponsive_on_its_own")
    assert ours == reference
    assert ours["fifo"]["dequeued_in_enqueue_order"] and ours["attempt_after_success"]["start_attempt"][0] == "preparing"
    running = {"attempt": "running", "heartbeat": True, "rollout": "running"}
    assert ours["spans_beat"]["unresponsive_after_span"] == running
    finished = ours["finished_updates"]
    assert (finished["rollout_succeeded_again"], finished["rollout_failed"]) == ("succeeded", "failed")
    assert finished["attempt_succeeded_again"] == ["succeeded", "succeeded"]  # the rollout follows its attempt
    assert finished["attempt_running"] == ["running", "running"]
    assert ours["requeued_dequeued"] == {case: ["requeuing", [True, "preparing", 2, "preparing"]]
                                         for case in ("running", "succeeded")}
    assert ours["unresponsive_revived"]["after_span"] == running
    assert ours["unresponsive_revived"]["older_attempt"][0] == ["running", True]
    # The timer: unresponsive, its rollout failed, as the reference's (whose check runs at the call, so it is so
    # 0.25 s after the heartbeat). How soon litstream's is so is measured, not asserted: bench/timer_latency.py.
    gone = {"attempt": "unresponsive", "heartbeat": True, "rollout": "failed"}
    assert reference_timer == {"on_time": gone, "settled": gone}
    assert ours_timer["settled"] == gone
    assert reference_differs == {"unresponsive_failed": {"attempt": "running", "heartbeat": True, "rollout": "failed"},
                                 "timeout_requeuing": {"attempt": "timeout", "heartbeat": True, "rollout": "running"}}
    assert ours_differ == {"unresponsive_failed": {"attempt": "unresponsive", "heartbeat": True, "rollout": "failed"},
                           "timeout_requeuing": {"attempt": "timeout", "heartbeat": True, "rollout": "requeuing"}}
