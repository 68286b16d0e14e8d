"""The command line: help everywhere, and `litstream demo --json` (the closed loop) as scripts use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = [[], ["demo"], ["up"], ["status"], ["topics"], ["topics", "create"], ["process", "lifecycle"],
            ["process", "span-sink"], ["process", "triplets"], ["process", "trainer"], ["runner"], ["gateway"],
            ["rollouts"], ["sql"], ["report"], ["replay"], ["enqueue"], ["healthcheck"], ["policy-server"]]


def run(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "litstream.app.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "litstream")
def test_help(cmd: list[str]) -> None:
    out = run(*cmd, "--help")
    assert out.returncode == 0, out.stderr
    assert "Usage:" in out.stdout


def test_the_closed_loop_publishes_versions_that_reach_spans_and_triplets(tmp_path: Path) -> None:
    """A short closed loop with the tiny policy: each trained version is published as a resources event, the
    runners pick it up, and the spans and triplets they produce name it."""
    out = run("demo", "--steps", "3", "--groups-per-step", "2", "--group-size", "2", "--runners", "1",
              "--concurrency", "4", "--json", cwd=tmp_path, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["trainer_steps"] == 3
    assert 0 in summary["versions"] and max(summary["versions"]) >= 1  # spans (ClickHouse) of a trained version
    assert any(v not in ("0", "None") for v in summary["triplets_by_version"])  # ... and triplets
    assert set(summary["mean_reward_by_version"]) == {str(v) for v in summary["versions"]}
    assert summary["by_status"] == {"succeeded": summary["rollouts"]}
    assert summary["spans_in_clickhouse"] == summary["spans_emitted"] > 0
    assert summary["triplets"] > 0 and Path(tmp_path / summary["reward_curve"]).exists()


def test_the_quick_slice_runs_without_training(tmp_path: Path) -> None:
    out = run("demo", "--slice", "--rollouts", "4", "--json", cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["rollouts"] == 4 and summary["by_status"] == {"succeeded": 4}
    assert summary["spans_in_clickhouse"] == summary["spans_emitted"] >= 12


def test_errors_say_what_to_do(tmp_path: Path) -> None:
    env_cwd = tmp_path
    out = subprocess.run([sys.executable, "-m", "litstream.app.cli", "rollouts"], capture_output=True, text=True,
                         timeout=60, cwd=env_cwd,
                         env={**os.environ, "LITSTREAM_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert out.returncode != 0
    out = run("runner", "--agent", "no.such.module:fn", cwd=tmp_path)
    assert out.returncode == 1 and "cannot load agent" in out.stderr
