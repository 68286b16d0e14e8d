"""Windows over triplets: count and time closing, partial and small groups, stale, duplicates, no reward."""

from __future__ import annotations

import json
from typing import Any

from litstream.schemas.events import EventMeta, TripletEmitted
from litstream.trainer.windows import WindowConfig, Windower, triplet_version


def trip(group: str, member: int, reward: float | None = 1.0, version: int | None = 0, attempt: str = "at-1",
         **kw: Any) -> TripletEmitted:
    meta = EventMeta(event_id=f"e-{group}-{member}-{attempt}", rollout_id=f"ro-{group}-{member}", producer_id="p",
                     producer_seq=member + 1, timestamp_ns=1)
    fields: dict[str, Any] = {
        "attempt_id": attempt, "group_id": group, "index": 0,
        "resources_id": None if version is None else f"policy-v{version}",
        "prompt_token_ids": [257, 97], "response_token_ids": [97, 258], "response_logprobs": [-1.0, -2.0],
        "reward": reward}
    fields.update(kw)
    return TripletEmitted(meta=meta, **fields)


def test_count_window_closes_on_complete_groups() -> None:
    w = Windower(WindowConfig(group_size=2, max_samples=4))
    assert w.add(trip("g1", 0), 0) is None
    assert w.add(trip("g2", 0), 0) is None
    assert w.add(trip("g1", 1), 0) is None  # 2 samples in complete groups
    win = w.add(trip("g2", 1), 0)
    assert win is not None and win.reason == "count" and win.number == 1
    assert sorted(g.group_id for g in win.groups) == ["g1", "g2"] and len(win.samples) == 4
    assert w.buffered == 0 and w.stats.trained_samples == 4 and w.stats.trained_groups == 2


def test_partial_group_is_carried_then_trained_and_small_group_dropped() -> None:
    w = Windower(WindowConfig(group_size=4, max_samples=4, min_group_size=2, max_carry=1))
    for i in range(3):
        w.add(trip("partial", i), 0)
    w.add(trip("single", 0), 0)
    first = None
    for i in range(4):
        first = w.add(trip("full", i), 0) or first
    assert first is not None and [g.group_id for g in first.groups] == ["full"]
    assert w.stats.carried_groups == 2  # partial and single wait for their members
    second = None
    for i in range(4):
        second = w.add(trip("full2", i), 0) or second
    # carried once already: now partial (3 >= min 2) trains, single (1 < 2) is dropped
    assert second is not None and sorted(g.group_id for g in second.groups) == ["full2", "partial"]
    assert w.stats.partial_groups_trained == 1
    assert w.stats.dropped_small_groups == 1 and w.stats.dropped_small_samples == 1
    # a late member of a trained (or dropped) group is refused
    w.add(trip("partial", 3), 0)
    w.add(trip("single", 1), 0)
    assert w.stats.late == 2 and w.buffered == 0


def test_time_window_and_flush() -> None:
    w = Windower(WindowConfig(group_size=4, max_samples=None, max_seconds=10.0, max_carry=0), now=0.0)
    w.add(trip("g", 0), 1.0)
    w.add(trip("g", 1), 2.0)
    assert w.poll(9.9) is None
    win = w.poll(10.0)
    assert win is not None and win.reason == "time" and len(win.samples) == 2  # partial, max_carry 0
    w.add(trip("h", 0), 11.0)
    w.add(trip("h", 1), 11.0)
    flushed = w.flush(12.0)
    assert flushed is not None and flushed.reason == "flush" and len(flushed.samples) == 2
    assert w.flush(13.0) is None and w.stats.empty_windows == 1


def test_duplicates_no_reward_and_malformed_are_counted_and_dropped() -> None:
    w = Windower(WindowConfig(group_size=2, max_samples=2))
    w.add(trip("g", 0), 0)
    w.add(trip("g", 0), 0)  # redelivered
    w.add(trip("g", 1, reward=None), 0)
    w.add(trip("g", 2, response_logprobs=[-1.0]), 0)  # one log-prob for two tokens
    w.add(trip("g", 3, response_token_ids=[], response_logprobs=[]), 0)
    assert w.stats.duplicates == 1 and w.stats.no_reward == 1 and w.stats.malformed == 2
    assert w.buffered == 1 and w.stats.received == 5 and w.stats.accepted == 1
    # another attempt of the same rollout is a different sample
    win = w.add(trip("g", 0, attempt="at-2"), 0)
    assert win is not None and len(win.samples) == 2


def test_stale_triplets_are_dropped_at_arrival_and_at_close() -> None:
    w = Windower(WindowConfig(group_size=2, max_samples=2, max_staleness=1), current_version=5)
    w.add(trip("old", 0, version=3), 0)  # 3 < 5 - 1
    assert w.stats.stale == 1 and w.buffered == 0
    w.add(trip("g", 0, version=4), 0)
    win = w.add(trip("g", 1, version=None), 0)  # unversioned: kept, counted
    assert w.stats.unversioned == 1 and win is not None and len(win.samples) == 2
    w2 = Windower(WindowConfig(group_size=2, max_samples=2, max_staleness=0), current_version=1)
    w2.add(trip("a", 0, version=1), 0)
    w2.set_version(2)  # a step happened meanwhile
    w2.add(trip("a", 1, version=2), 0)
    assert w2.stats.stale_at_close == 1  # the v1 member went stale before the window closed
    assert w2.buffered == 1


def test_version_parsing() -> None:
    assert triplet_version(trip("g", 0, version=7)) == 7
    assert triplet_version(trip("g", 0, version=None, policy_version="policy-v3")) == 3
    assert triplet_version(trip("g", 0, version=None, policy_version="4")) == 4
    assert triplet_version(trip("g", 0, version=None, resources_id="rs-abc")) is None


def test_snapshot_restore_round_trip() -> None:
    cfg = WindowConfig(group_size=3, max_samples=3)
    w = Windower(cfg, current_version=2)
    w.add(trip("g", 0, version=2), 0)
    w.add(trip("g", 1, version=2), 0)
    snap = json.loads(json.dumps(w.snapshot()))
    r = Windower.restore(cfg, snap)
    assert r.buffered == 2 and r.version == 2 and r.stats == w.stats
    r.add(trip("g", 1, version=2), 0)  # remembered as seen
    assert r.stats.duplicates == 1
    win = r.add(trip("g", 2, version=2), 0)
    assert win is not None and len(win.samples) == 3
