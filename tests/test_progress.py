"""A runner's progress line."""

from __future__ import annotations

from litstream.workers.progress import Progress


def test_the_line_has_done_rate_mean_reward_and_policy() -> None:
    p = Progress(started=0.0, _last_time=0.0)
    p.record("succeeded", 1.0, "policy-v3")
    p.record("failed", None, None)
    p.record("succeeded", 0.0, None)
    assert p.line(now=2.0) == "progress: 3 attempts done (1 failed), 1.5/s, mean reward 0.500, policy policy-v3"
    assert p.line(now=4.0).startswith("progress: 3 attempts done (1 failed), 0.0/s")  # the rate since the last line


def test_no_reward_yet_is_a_dash() -> None:
    assert "mean reward -, policy -" in Progress().line()


def test_an_idle_runner_says_so_less_often() -> None:
    p = Progress(started=0.0, _last_time=0.0)
    assert not p.due(3.0, every=5.0)
    p.record("succeeded", 1.0, None)
    assert p.due(5.0, every=5.0)
    p.line(now=5.0)
    assert not p.due(10.0, every=5.0)  # nothing new: no line at the usual pace
    assert p.due(65.0, every=5.0)  # but one a minute, so a silent runner is seen alive
