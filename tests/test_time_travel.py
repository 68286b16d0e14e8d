"""Time travel on the real broker: the state replayed up to a moment (a time, or offsets) equals the live state
recorded at that moment; the gateway's ``as_of`` and ``litstream replay --until`` show the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from litstream.app.stack import Stack, settings_env
from litstream.infra.broker import free_port
from litstream.infra.kafka import end_offsets, topic_partitions
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.events import RolloutSnapshot
from litstream.streams.replay import Until, comparable, diff, parse_until, replay
from tests.lifecycle_helpers import Driver
from tests.test_gateway import call


@dataclass
class Moment:
    time: float
    offsets: dict[int, int]
    live: dict[str, RolloutSnapshot]


@pytest.fixture
def stack(settings: Settings) -> Iterator[tuple[Driver, str]]:
    port = free_port()
    with Stack(settings) as s:
        s.start("lifecycle", "process", "lifecycle")
        s.start("gateway", "gateway", "--port", str(port))
        s.wait_ready("lifecycle", "lifecycle")
        s.wait_ready("gateway", "gateway")
        driver = Driver(settings)
        yield driver, f"http://127.0.0.1:{port}"
        driver.close()


def moment(settings: Settings, d: Driver) -> Moment:
    """The live state now (every event written so far folded: each phase waits for its last one), where the log
    ends, and the time; the next phase writes from a later millisecond."""
    topic = Topics(settings.topic_prefix).rollout_events
    offsets = end_offsets(settings, topic, topic_partitions(settings, topic))
    now = time.time()
    live = dict(d.view.catch_up())
    time.sleep(0.05)
    return Moment(now, offsets, live)


def test_replay_until_a_moment_equals_the_live_state_then(settings: Settings,
                                                          stack: tuple[Driver, str]) -> None:
    d, base = stack
    moments: list[Moment] = []
    rids = [d.enqueue(max_attempts=2, retry_condition=["failed"]) for _ in range(3)]
    for rid in rids:
        d.wait(rid, lambda s: s.status == "queuing")
    moments.append(moment(settings, d))

    for i, rid in enumerate(rids):
        d.claim(rid, 1, f"at-{i}")
    for rid in rids:
        d.wait(rid, lambda s: s.status == "preparing")
    moments.append(moment(settings, d))

    for i, rid in enumerate(rids):
        d.beat(rid, f"at-{i}")
        d.finish(rid, f"at-{i}", "failed" if i == 0 else "succeeded")
    for rid in rids:
        d.wait(rid, lambda s: s.status in {"requeuing", "succeeded"})
    moments.append(moment(settings, d))

    d.claim(rids[0], 2, "at-again")
    d.finish(rids[0], "at-again", "succeeded")
    d.wait(rids[0], lambda s: s.status == "succeeded")
    moments.append(moment(settings, d))
    assert [sorted(s.status for s in m.live.values()) for m in moments] == [
        ["queuing"] * 3, ["preparing"] * 3, ["requeuing", "succeeded", "succeeded"], ["succeeded"] * 3]

    for m in moments:
        by_offsets = replay(settings, until=Until(offsets=m.offsets))
        assert diff(by_offsets.states, m.live) == []
        assert by_offsets.until == m.offsets
        by_time = replay(settings, until=Until(time=m.time))
        assert diff(by_time.states, m.live) == []
        assert by_time.until == m.offsets  # the time names the same point of the log

    # One rollout, through the gateway and the command line: its state at the third moment, as recorded then.
    third, rid = moments[2], rids[0]
    as_of = urllib.parse.quote(str(Until(time=third.time)))
    status, body = call(f"{base}/v1/rollouts/{rid}?as_of={as_of}", token=None)
    assert status == 200 and body.pop("as_of") == str(Until(offsets=third.offsets))
    assert body == comparable(third.live[rid]) and body["status"] == "requeuing"
    status, body = call(f"{base}/v1/rollouts?as_of={as_of}&status=succeeded", token=None)
    assert status == 200 and sorted(i["rollout_id"] for i in body["items"]) == sorted(rids[1:])
    status, body = call(f"{base}/v1/rollouts/{rid}", token=None)
    assert status == 200 and body["status"] == "succeeded" and "as_of" not in body  # now
    out = subprocess.run([sys.executable, "-m", "litstream.app.cli", "replay", "--until",
                          str(Until(offsets=third.offsets)), "--rollout", rid],
                         env={**os.environ, **settings_env(settings)}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == comparable(third.live[rid])

    # Before anything was written: no rollout; bad points are clear errors.
    status, body = call(f"{base}/v1/rollouts?as_of={moments[0].time - 60}", token=None)
    assert status == 200 and body["items"] == [] and body["total"] == 0
    assert call(f"{base}/v1/rollouts/{rid}?as_of={moments[0].time - 60}", token=None)[0] == 404
    status, body = call(f"{base}/v1/rollouts?as_of=yesterday", token=None)
    assert status == 400 and body["field"] == "as_of" and "0:120,1:98" in body["error"]
    status, body = call(f"{base}/v1/rollouts?as_of=7:1", token=None)
    assert status == 400 and "no partition 7" in body["error"]


@pytest.mark.parametrize("text, expected", [
    ("0:120,1:98", Until(offsets={0: 120, 1: 98})),
    ("1795868400.5", Until(time=1795868400.5)),
    ("2026-11-28T10:32:00+00:00", Until(time=1795861920.0)),
    ("2026-11-28T10:32:00Z", Until(time=1795861920.0)),
])
def test_points_of_the_log_are_parsed(text: str, expected: Until) -> None:
    assert parse_until(text) == expected


@pytest.mark.parametrize("text", ["yesterday", "0:1,0:2", "-5", "0:x", ""])
def test_a_point_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_until(text)
