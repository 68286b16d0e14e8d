"""`litstream train` and `Trainer.fit` interrupted: Ctrl-C at each stage, a runner killed mid-run; every process
stops, and a rerun resumes from the checkpoints (split from test_fit.py so the two test workers balance)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from litstream.app.fit import Trainer
from litstream.infra.settings import Settings
from litstream.trainer.algorithm import Baseline
from tests.test_fit import _settings, _train_cmd


def _checkpoint_versions(root: Path) -> list[int]:
    """The versions checkpointed under ``root``: ``root/<run id>/vN``, each run's own."""
    from litstream.trainer.checkpoint import list_checkpoints

    return [v for run in root.glob("run-*") for v, _ in list_checkpoints(run)] if root.exists() else []


def _descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (children started in their own sessions included), by pid: command line."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                try:
                    found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    found[child] = "?"
                frontier.append(child)
    return found


def _still_running(pids: dict[int, str]) -> list[str]:
    """What ``ps`` still lists of ``pids`` (zombies left out: they are only waiting to be reaped)."""
    if not pids:
        return []
    out = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-p", ",".join(map(str, pids))], capture_output=True,
                         text=True).stdout
    return [line.strip() for line in out.splitlines() if line.split()[1:2] and not line.split()[1].startswith("Z")]


def _interrupt_when(cmd: list[str], env: dict[str, str], ready: Callable[[dict[int, str]], bool],
                    ) -> tuple[subprocess.CompletedProcess[str], dict[int, str]]:
    """Run ``cmd`` in a session of its own, send its process group SIGINT (what Ctrl-C in a terminal does) once
    ``ready(descendants)`` holds, and wait for it to exit; returns its outcome and every process it had started."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    seen: dict[int, str] = {}
    try:
        for _ in range(4800):
            seen.update(_descendants(proc.pid))
            if proc.poll() is not None or ready(seen):
                break
            time.sleep(0.25)
        assert proc.poll() is None, f"exited before the interrupt: {proc.communicate()[1][-3000:]}"
        seen.update(_descendants(proc.pid))
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        try:  # whatever went wrong, no process of that stack outlives the test
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in _descendants(proc.pid) | seen:
            try:
                os.kill(pid, signal.SIGKILL) if proc.returncode is None else None
            except ProcessLookupError:
                pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), seen


def _role(seen: dict[int, str], *names: str) -> bool:
    return all(any(name in cmd for cmd in seen.values()) for name in names)


@pytest.mark.slow(enabled_by="LITSTREAM_LONG_RUNS")  # a minute or more; CI runs it (.ci/run)
@pytest.mark.timeout(1800)
def test_ctrl_c_during_fit_stops_cleanly_and_a_rerun_resumes_from_the_checkpoints(tmp_path: Path) -> None:
    env = {**os.environ, "LITSTREAM_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1",
           "LITSTREAM_BROKER_STORAGE": "durable"}  # the log on disk, as a run keeps it for --resume
    checkpoints = tmp_path / "data" / "train" / "checkpoints"
    done, seen = _interrupt_when(_train_cmd("--train", "examples/data/copy_train.jsonl", "--passes", "5"), env,
                                 lambda _: max(_checkpoint_versions(checkpoints), default=0) >= 1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Aborted" not in done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["interrupted"] is True and summary["stopped"] == "stopped by the user"
    assert set(summary) >= {"versions", "train_reward_by_version", "val_reward_by_version", "rollouts", "failed"}
    assert _role(seen, "kafka.Kafka", "process lifecycle", "process span-sink", "process triplets",
                 "process trainer", "runner")
    assert _still_running(seen) == []  # broker, pipeline, trainer, policy server, runners: all stopped
    reached = max(_checkpoint_versions(checkpoints))
    assert reached >= 1

    small = tmp_path / "small.jsonl"
    small.write_text('{"letter": "a", "count": 1}\n')
    again = subprocess.run(_train_cmd("--train", str(small), "--resume", "--passes", "1"), env=env,
                           capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = json.loads(again.stdout.splitlines()[-1])
    assert min(int(v) for v in resumed["train_reward_by_version"]) >= reached  # went on, not from v0
    assert resumed["run_id"] == summary["run_id"]  # the same run
    assert resumed["rollouts"] == 2
    assert set(resumed["left_unfinished"]) <= FINISHED  # what the Ctrl-C left in flight has ended
    assert set(resumed["log_statuses"]) <= FINISHED


FINISHED = {"succeeded", "failed", "cancelled"}


@pytest.mark.slow(enabled_by="LITSTREAM_LONG_RUNS")  # a minute or more; CI runs it (.ci/run)
@pytest.mark.timeout(900)
def test_a_run_killed_outright_resumes_and_accounts_for_every_rollout(tmp_path: Path) -> None:
    """SIGKILL to `litstream train` and every process it started (as a crash of the machine would) while some
    rollouts run and others wait; `--resume` goes on with the same run on the same log, and each rollout the run
    left ends (run, retried, or cancelled when no runner took it): none is lost, none stays open. A second run in
    the same data dir keeps the first one's history."""
    from litstream.infra import health

    env = {**os.environ, "LITSTREAM_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1", "COLUMNS": "200",
           "LITSTREAM_BROKER_STORAGE": "durable"}  # the log on disk, as a run keeps it (the suite's default: in tmp)
    run_dir = tmp_path / "data" / "train"
    tasks, quick = tmp_path / "slow.jsonl", tmp_path / "quick.jsonl"
    tasks.write_text("".join(json.dumps({"seconds": 6.0, "i": i}) + "\n" for i in range(6)))
    quick.write_text(json.dumps({"seconds": 0.1}) + "\n")

    def cmd(*extra: str) -> list[str]:
        return [sys.executable, "-m", "litstream.app.cli", "train", "--agent", "tests.fit_agents:slow_agent",
                "--algorithm", "baseline", "--runners", "1", "--concurrency", "2", "--json", *extra]

    proc = subprocess.Popen(cmd("--train", str(tasks)), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    seen: dict[int, str] = {}
    try:
        for _ in range(2400):  # until the runner runs two and four wait
            seen.update(_descendants(proc.pid))
            info = health.read(run_dir, "runner") or {}
            if proc.poll() is not None or int(info.get("claimed", 0) or 0) > 0:
                break
            time.sleep(0.25)
        assert proc.poll() is None, f"exited before the kill: {proc.communicate()[1][-3000:]}"
        seen.update(_descendants(proc.pid))
        for pid in [proc.pid, *seen]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(60)
    finally:
        for pid in [proc.pid, *_descendants(proc.pid), *seen]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]

    again = subprocess.run(cmd("--train", str(quick), "--resume"), env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = json.loads(again.stdout.splitlines()[-1])
    assert resumed["run_id"] == run_id and resumed["by_status"] == {"succeeded": 1}
    left = resumed["left_unfinished"]
    assert left and set(left) <= FINISHED, json.dumps(resumed)  # each rollout the kill left has ended
    assert sum(resumed["log_statuses"].values()) == 6 + 1 and set(resumed["log_statuses"]) <= FINISHED, resumed

    later = subprocess.run(cmd("--train", str(quick)), env=env, capture_output=True, text=True, timeout=600)
    assert later.returncode == 0, later.stderr[-3000:]
    assert json.loads(later.stdout.splitlines()[-1])["log_statuses"] == {"succeeded": 1}  # a run of its own
    runs = subprocess.run([sys.executable, "-m", "litstream.app.cli", "runs", "--json"], capture_output=True,
                          text=True, timeout=120, env={**env, "LITSTREAM_DATA_DIR": str(run_dir)})
    assert runs.returncode == 0, runs.stderr
    listed = [json.loads(line) for line in runs.stdout.splitlines()]
    assert [(r["run_id"] == run_id, r["rollouts"], r["status"]) for r in listed] == [(True, 7, "finished"),
                                                                                     (False, 1, "finished")]


@pytest.mark.timeout(900)
def test_ctrl_c_while_the_stack_starts_stops_every_process_it_started_and_prints_the_summary(
        tmp_path: Path) -> None:
    env = {**os.environ, "LITSTREAM_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}
    done, seen = _interrupt_when(_train_cmd("--train", "examples/data/copy_train.jsonl"), env,
                                 lambda s: _role(s, "kafka.Kafka", "process lifecycle"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Aborted" not in done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["interrupted"] is True
    assert "interrupted (Ctrl-C or SIGTERM): stopped cleanly" in done.stderr
    assert _still_running(seen) == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ctrl_c_during_the_demo_prints_its_summary_and_leaves_no_process(tmp_path: Path) -> None:
    """The demo is one use of Trainer.fit; this runs it with its trainer and runner up (~1-3 min on 2 cores)."""
    env = {**os.environ, "LITSTREAM_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "litstream.app.cli", "demo", "--steps", "50", "--minutes", "5", "--concurrency",
           "8", "--json"]
    done, seen = _interrupt_when(cmd, env, lambda s: _role(s, "runner", "process trainer"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Aborted" not in done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["interrupted"] is True
    assert "interrupted: stopped on request" in done.stderr
    assert _role(seen, "kafka.Kafka", "process lifecycle", "process span-sink", "process triplets")
    assert _still_running(seen) == []


@pytest.mark.slow(enabled_by="LITSTREAM_LONG_RUNS")  # a minute or more; CI runs it (.ci/run)
@pytest.mark.timeout(900)
def test_a_runner_killed_during_fit_is_restarted_and_its_rollouts_retried(tmp_path: Path) -> None:
    import threading

    from litstream.infra import health
    from litstream.schemas.models import RolloutConfig
    from litstream.streams.stateview import StateView

    settings = _settings(tmp_path)
    run_dir = settings.data_dir / "train"
    killed: list[int] = []

    def kill_the_runner_once_it_works() -> None:
        for _ in range(2400):
            info = health.read(run_dir, "runner") or {}
            if int(info.get("claimed", info.get("attempts", 0)) or 0) > 0 or info.get("running"):
                os.kill(int(info["pid"]), signal.SIGKILL)
                killed.append(int(info["pid"]))
                return
            time.sleep(0.25)

    attempts: dict[str, int] = {}

    def count_attempts(s: Settings) -> None:
        with StateView(s) as view:
            attempts.update({rid: len(snap.attempts) for rid, snap in view.catch_up().items()})

    threading.Thread(target=kill_the_runner_once_it_works, daemon=True).start()
    # Tasks long enough that the kill, up to ~2.5 s after the first claim (the health file is written every 2 s),
    # lands while they run on a loaded machine.
    tasks = [{"seconds": 8.0, "i": i} for i in range(4)]
    summary = Trainer(algorithm=Baseline(), n_runners=1, concurrency=4, settings=settings, quiet=True,
                      rollout_config=RolloutConfig(unresponsive_seconds=8, max_attempts=3,
                                                   retry_condition=["unresponsive"]),
                      on_finish=count_attempts).fit("tests.fit_agents:slow_agent", tasks)
    assert killed, "the runner never reported work"
    assert summary.rollouts == len(tasks) and summary.by_status == {"succeeded": len(tasks)}
    assert max(attempts.values()) >= 2  # what the killed runner held was run again
