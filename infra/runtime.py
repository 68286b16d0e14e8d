"""Process-wide settings of litstream's long-running services (gateway, sink, runner, policy server)."""

from __future__ import annotations

import gc

# CPython collects its youngest generation every 700 net allocations of container objects. A service allocates
# a few dozen per event (records, models, dicts) and holds many of them for a while (a batch, the views, the
# states it keeps), so it spends a fifth of its CPU re-walking live objects: measured with the store's
# enqueue_many, 65 -> 50 CPU-µs per rollout (docs/benchmarks.md, "The collector's threshold").
YOUNG_COLLECTION_THRESHOLD = 10_000


def tune_gc_for_service() -> None:
    """Collect the young generation every ``YOUNG_COLLECTION_THRESHOLD`` allocations. Reference cycles still go,
    later: at most that many more objects wait for the collector (a few MB)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)
