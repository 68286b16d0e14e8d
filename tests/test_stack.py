"""The supervisor of `litstream up`: restarts with backoff, gives up on a child that keeps failing (naming it,
with its log), and one stack per data dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from litstream.app.stack import ChildFailedError, RestartPolicy, Stack, StackLock, StackLockedError, log_tail
from litstream.infra.settings import Settings
from tests.waiting import until


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_child_that_keeps_failing_stops_the_stack_naming_it_with_its_log(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    stack = Stack(settings, policy=RestartPolicy(backoff_s=0.05, max_restarts=2, window_s=600))
    events: list[str] = []
    try:
        stack.start("bad-runner", "runner", "--agent", "no.such.module:agent")

        def supervise() -> ChildFailedError | None:
            try:
                events.extend(stack.supervise())
            except ChildFailedError as exc:
                return exc
            return None

        failure = until("the supervisor to give up on bad-runner", supervise, timeout=120, every=0.05)
    finally:
        stack.stop()
    assert failure.name == "bad-runner" and failure.code == 1
    assert "bad-runner kept failing (3 crashes, last exit code 1)" in str(failure)
    assert any("cannot load agent" in line for line in failure.tail)  # the log's last lines, in the message
    assert "cannot load agent" in str(failure)
    assert sum("restarted" in e for e in events) == 2  # restarted twice before giving up


def test_a_second_stack_on_the_same_data_dir_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    first, second = StackLock(tmp_path), StackLock(tmp_path)
    first.acquire()
    try:
        (tmp_path / "stack.json").write_text(json.dumps({"pid": __import__("os").getpid(),
                                                          "bootstrap_servers": "127.0.0.1:4242",
                                                          "gateway_url": "http://127.0.0.1:8080"}))
        before = (tmp_path / "stack.json").read_text()
        with pytest.raises(StackLockedError, match="already runs") as info:
            second.acquire()
        assert "127.0.0.1:4242" in str(info.value) and "http://127.0.0.1:8080" in str(info.value)
        assert (tmp_path / "stack.json").read_text() == before  # touched nothing
    finally:
        first.release()
    second.acquire()  # free again once the first is gone
    second.release()


def test_log_tail_reads_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(log, 3) == ["line 97", "line 98", "line 99"]
    assert log_tail(tmp_path / "missing.log") == []


def test_a_killed_broker_is_started_again_on_its_log_and_keeps_what_it_had(tmp_path: Path) -> None:
    from litstream.infra.kafka import producer, read_to_end

    settings = Settings(data_dir=tmp_path / "data", topic_prefix="restart", partitions=1)
    stack = Stack(settings, policy=RestartPolicy(max_restarts=1, window_s=600))
    try:
        bootstrap = stack.start_broker()
        stack.create_topics()
        topic = f"{settings.topic_prefix}.rollout-events"
        p = producer(stack.settings)
        for i in range(5):
            p.produce(topic, f"record-{i}".encode(), b"k")
        assert p.flush(30) == 0
        del p
        stack.broker.kill()  # type: ignore[union-attr]
        said = stack.supervise()
        assert len(said) == 1 and said[0].startswith("broker exited with code -9; started again on its log"), said
        assert stack.broker is not None and stack.broker.alive() and stack.broker.bootstrap == bootstrap
        assert [m.value() for m in read_to_end(stack.settings, topic)] == [f"record-{i}".encode() for i in range(5)]
        stack.broker.kill()
        with pytest.raises(RuntimeError, match="the Kafka broker exited"):  # past its one allowed restart
            stack.supervise()
    finally:
        stack.stop()


STARTS_A_STACK = """
import json, sys, time
from pathlib import Path
from litstream.app.stack import Stack
from litstream.infra.settings import Settings

stack = Stack(Settings(data_dir=Path(sys.argv[1]), topic_prefix="orphans", partitions=1))
stack.start_broker()
stack.create_topics()
role = stack.start("lifecycle", "process", "lifecycle")
print(json.dumps({"broker": stack.broker.proc.pid, "lifecycle": role.proc.pid}), flush=True)
time.sleep(600)
"""


def test_a_sigkilled_stack_leaves_no_process_behind(tmp_path: Path) -> None:
    """SIGKILL gives the stack no chance to stop its children: they stop themselves (the broker's JVM too)."""
    import os
    import signal
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", STARTS_A_STACK, str(tmp_path / "data")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout is not None
        children: dict[str, int] = json.loads(parent.stdout.readline())
        assert all(Path(f"/proc/{pid}").exists() for pid in children.values())
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)

    def gone(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        return state == "Z"  # a zombie has stopped; its reaper (init here) collects it

    try:
        for name, pid in children.items():
            until(f"{name} to stop with its parent", lambda p=pid: gone(p), timeout=90)
    finally:
        for pid in children.values():
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
