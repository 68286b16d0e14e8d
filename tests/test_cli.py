"""The command line: help everywhere, and `litstream demo --json` as scripts use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = [[], ["demo"], ["up"], ["status"], ["topics"], ["topics", "create"], ["process", "lifecycle"],
            ["process", "span-sink"], ["runner"], ["gateway"], ["rollouts"], ["sql"], ["enqueue"], ["healthcheck"]]


def run(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "litstream.infra.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "litstream")
def test_help(cmd: list[str]) -> None:
    out = run(*cmd, "--help")
    assert out.returncode == 0, out.stderr
    assert "Usage:" in out.stdout


def test_demo_json_ends_with_one_summary_line(tmp_path: Path) -> None:
    out = run("demo", "--rollouts", "4", "--json", cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["rollouts"] == 4 and summary["by_status"] == {"succeeded": 4}
    assert summary["spans_emitted"] >= 12
    assert summary["spans_in_clickhouse"] == summary["spans_emitted"]


def test_errors_say_what_to_do(tmp_path: Path) -> None:
    env_cwd = tmp_path
    out = subprocess.run([sys.executable, "-m", "litstream.infra.cli", "rollouts"], capture_output=True, text=True,
                         timeout=60, cwd=env_cwd,
                         env={**os.environ, "LITSTREAM_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert out.returncode != 0
    out = run("runner", "--agent", "no.such.module:fn", cwd=tmp_path)
    assert out.returncode == 1 and "cannot load agent" in out.stderr
