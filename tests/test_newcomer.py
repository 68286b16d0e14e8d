"""A newcomer's session on the embedded stack, through the `litstream` command as a person types it: up, status
while it starts, enqueue, a runner, sql (an INSERT too, refused), report, a second up (refused), a killed child
(restarted), Ctrl-C. Exit codes and messages are checked, and that the stack keeps running and loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from litstream.infra.broker import free_port
from litstream.infra.health import pid_alive
from tests.waiting import until


@dataclass
class Session:
    cwd: Path
    env: dict[str, str]
    up: subprocess.Popen[str]
    up_log: Path
    gateway: str

    @property
    def data(self) -> Path:
        return self.cwd / "data"

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "litstream.app.cli", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=self.cwd, env=self.env)

    def health(self, role: str) -> dict[str, Any]:
        try:
            return json.loads((self.data / "health" / f"{role}.json").read_text())  # type: ignore[no-any-return]
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def output(self) -> str:
        return self.up_log.read_text(errors="replace")

    def sql_value(self, query: str) -> str:
        out = self.run("sql", query, "--format", "csv")
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()[1]


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITSTREAM_")}
    env.update({"LITSTREAM_DATA_DIR": str(tmp_path / "data"), "LITSTREAM_GATEWAY_PORT": str(port),
                "LITSTREAM_SESSION_TIMEOUT_MS": "3000", "OMP_NUM_THREADS": "1", "COLUMNS": "200",
                "LITSTREAM_POLICY_SERVER_PORT": "0"})
    log = tmp_path / "up.log"
    with log.open("w") as out:
        up = subprocess.Popen([sys.executable, "-m", "litstream.app.cli", "up"], cwd=tmp_path, env=env,
                              stdout=out, stderr=subprocess.STDOUT, text=True)
    s = Session(tmp_path, env, up, log, f"http://127.0.0.1:{port}")
    try:
        yield s
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                up.kill()


def _post_sql(url: str, query: str) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"{url}/v1/sql", data=json.dumps({"query": query}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _rollouts_done(s: Session, n: int) -> bool:
    out = s.run("rollouts", "--json")
    snaps = [json.loads(line) for line in out.stdout.splitlines()]
    return len(snaps) == n and all(x["status"] == "succeeded" for x in snaps)


def _spans_settled(s: Session, rollouts: int) -> Callable[[], int | None]:
    """A check for ``until``: the count of stored spans once ``rollouts`` rollouts have spans and the count held
    between two reads (the sink inserts a batch every half second; a rollout may be visible before its last
    spans are)."""
    last: list[int] = []

    def settled() -> int | None:
        if s.sql_value("SELECT uniqExact(rollout_id) FROM spans FINAL") != str(rollouts):
            return None
        now = int(s.sql_value("SELECT count() FROM spans FINAL"))
        held = bool(last) and last[-1] == now
        last.append(now)
        return now if held else None

    return settled


def _start_and_check_status_while_starting(s: Session) -> None:
    early = s.run("status")  # while `up` is starting: a diagnosis, never a crash, never chDB opened here
    assert early.returncode in (0, 1) and "Traceback" not in early.stdout + early.stderr
    until("the stack file", lambda: (s.data / "stack.json").exists(), timeout=60)
    starting = s.run("status")  # the stack runs, its sink may still be opening ClickHouse
    assert starting.returncode in (0, 1) and "Traceback" not in starting.stdout + starting.stderr
    until("the sink and the lifecycle processor", lambda: "inserted" in s.health("span-sink")
          and s.health("lifecycle") and not s.health("lifecycle").get("starting"), timeout=120)
    assert s.run("status").returncode == 0
    assert f"gateway on {s.gateway}" in s.output()


def _enqueue_and_run(s: Session, count: int) -> None:
    out = s.run("enqueue", '{"a": 2, "op": "+", "b": 3}', "--count", str(count))
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == count and all(i.startswith("ro-") for i in out.stdout.split())
    runner = s.run("runner", "--max-rollouts", str(count), "--progress-every", "0.5", timeout=180)
    assert runner.returncode == 0, runner.stderr[-2000:]
    # the line a person watches: attempts done, rate, mean reward (the toy policy adds right), policy version
    assert f"progress: {count} attempts done (0 failed)" in runner.stderr and "mean reward 1.000" in runner.stderr


def _sql_cannot_change_anything(s: Session) -> None:
    insert = s.run("sql", "INSERT INTO spans (SpanName) VALUES ('x')")
    assert insert.returncode == 2 and "INSERT is not allowed" in insert.stderr
    several = s.run("sql", "SELECT 1; DROP TABLE spans")
    assert several.returncode == 2 and "2 statements given" in several.stderr
    status, body = _post_sql(s.gateway, "ALTER TABLE spans DELETE WHERE 1")
    assert status == 400 and "ALTER is not allowed" in body["error"]
    status, body = _post_sql(s.gateway, "SELECT count() FROM spans FINAL")
    assert status == 200 and body["rows"][0][0] > 0
    assert s.up.poll() is None and "supervisor:" not in s.output()  # nothing crashed, nothing restarted


def _second_up_is_refused(s: Session) -> None:
    before = (s.data / "stack.json").read_text()
    second = s.run("up", timeout=60)
    assert second.returncode == 1
    assert "already runs" in second.stderr and f"pid {s.up.pid}" in second.stderr
    assert (s.data / "stack.json").read_text() == before and s.up.poll() is None


def _killed_child_comes_back(s: Session) -> None:
    old = s.health("span-sink")["pid"]
    os.kill(old, signal.SIGKILL)
    until("the sink restarted", lambda: s.health("span-sink").get("pid") not in (None, old)
          and "inserted" in s.health("span-sink"), timeout=120)
    assert "span-sink exited with code -9; restarting" in s.output()


@pytest.mark.slow(enabled_by="LITSTREAM_LONG_RUNS")  # a minute or more; CI runs it (.ci/run)
def test_a_newcomers_session(session: Session) -> None:
    s = session
    _start_and_check_status_while_starting(s)
    _enqueue_and_run(s, 3)
    spans_before = until("3 rollouts' spans, all stored", _spans_settled(s, 3), timeout=120, every=1.5)
    _sql_cannot_change_anything(s)
    report = s.run("report")
    assert report.returncode == 0 and "Reward by resources version" in report.stdout, report.stderr
    _second_up_is_refused(s)

    _killed_child_comes_back(s)
    _enqueue_and_run(s, 2)  # the stack keeps ingesting after the restart, and loses nothing
    spans_after = until("5 rollouts' spans, all stored", _spans_settled(s, 5), timeout=120, every=1.5)
    assert spans_after == spans_before * 5 // 3
    until("5 rollouts succeeded", lambda: _rollouts_done(s, 5), timeout=120)

    children = [s.health(role).get("pid") for role in ("lifecycle", "span-sink", "gateway")]
    s.up.send_signal(signal.SIGINT)  # Ctrl-C
    assert s.up.wait(90) == 0
    assert "stopping" in s.output() and not (s.data / "stack.json").exists()
    assert not any(pid_alive(int(pid)) for pid in children if pid)


def test_a_child_that_keeps_failing_stops_up_with_exit_1_naming_it(tmp_path: Path) -> None:
    """The sink dies after every insert (a failpoint), so its restart dies too: `up` gives up, says which child
    and shows its log's last lines, stops the rest, and exits 1 (it used to exit 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITSTREAM_")}
    env.update({"LITSTREAM_DATA_DIR": str(tmp_path / "data"), "LITSTREAM_SESSION_TIMEOUT_MS": "3000",
                "LITSTREAM_POLICY_SERVER_PORT": "0",
                "LITSTREAM_FAILPOINTS": "span-sink.after-insert", "OMP_NUM_THREADS": "1"})
    up = subprocess.Popen([sys.executable, "-m", "litstream.app.cli", "up", "--no-gateway", "--max-restarts", "1"],
                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        until("the stack file", lambda: (tmp_path / "data" / "stack.json").exists() or up.poll() is not None,
              timeout=60)
        enq = subprocess.run([sys.executable, "-m", "litstream.app.cli", "enqueue", "{}"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path, env=env)
        assert enq.returncode == 0, enq.stderr
        _, err = up.communicate(timeout=180)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 1
    assert "span-sink kept failing (2 crashes, last exit code 137)" in err
    assert "failpoint span-sink.after-insert hit 1" in err  # the last lines of its log
    assert not (tmp_path / "data" / "stack.json").exists()
