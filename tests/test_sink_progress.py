"""Read-your-writes for spans waits for the queried rollout's own spans, not for everything the store wrote."""

from __future__ import annotations

from litstream.infra.settings import Settings
from litstream.streams.sink_progress import SinkProgress


def test_a_query_waits_for_its_rollouts_newest_span_only() -> None:
    progress = SinkProgress(Settings(), "spans", max_rollouts=2)
    progress.written("ro-a", 0, 5)
    progress.written("ro-a", 0, 3)  # a late delivery report of an older span moves nothing back
    progress.written("ro-b", 1, 9)
    assert progress.wanted("ro-a") == {0: 5} and progress.wanted("ro-b") == {1: 9}
    assert progress.wanted("ro-elsewhere") == {}  # no span of it written here: nothing to wait for


def test_a_forgotten_rollout_waits_for_the_highest_offset_forgotten() -> None:
    progress = SinkProgress(Settings(), "spans", max_rollouts=2)
    for rid, partition, offset in (("ro-a", 0, 5), ("ro-b", 1, 9), ("ro-a", 0, 6), ("ro-c", 0, 7), ("ro-d", 1, 2)):
        progress.written(rid, partition, offset)
    # ro-b went first (ro-a was written again after it), then ro-a: the window keeps ro-c and ro-d.
    assert progress.wanted("ro-c") == {0: 7} and progress.wanted("ro-d") == {1: 2}
    assert progress.wanted("ro-b") == {0: 6, 1: 9} == progress.wanted("ro-never")


def test_a_store_with_nothing_written_needs_no_broker() -> None:
    progress = SinkProgress(Settings(bootstrap_servers="127.0.0.1:1"), "spans")
    progress.wait("ro-a", timeout=0.1)  # returns at once: no consumer is made
    progress.close()
