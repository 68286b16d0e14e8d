"""What bounds the lifecycle processor's memory: one RocksDB budget for every table partition, no cached state for
a finished rollout, and a timer heap that keeps few superseded entries. In-process, no worker runs."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from faust.stores.rocksdb import RocksDBOptions

from litstream.infra.settings import Settings
from litstream.schemas.events import (
    AttemptHeartbeat,
    AttemptStarted,
    AttemptStatusChanged,
    AvroRolloutConfig,
    EventFactory,
    RolloutEnqueued,
)
from litstream.streams import fold, lifecycle, table_store
from litstream.streams.state import RolloutState


def test_every_table_partition_draws_on_one_rocksdb_budget(tmp_path: Path) -> None:
    store = SimpleNamespace(rocksdb_options=RocksDBOptions(write_buffer_size=1 << 20, max_write_buffer_number=2))
    table_store.bound_memory(store, 8 << 20, 4 << 20)
    dbs = [store.rocksdb_options.open(tmp_path / f"rollouts-{p}.db") for p in range(3)]
    try:
        for p, db in enumerate(dbs):
            for i in range(2_000):
                db[f"ro-{p}-{i}".encode()] = b"x" * 500
        capacities = {db.property_int_value("rocksdb.block-cache-capacity") for db in dbs}
        usages = {db.property_int_value("rocksdb.block-cache-usage") for db in dbs}
        assert capacities == {8 << 20}  # one cache of the budget's size, not one per partition
        assert len(usages) == 1 and usages.pop() > 0  # the same cache, charged with the memtables
    finally:
        for db in dbs:
            db.close()


def _states(unresponsive_s: float, beats: int) -> tuple[str, list[RolloutState]]:
    """A rollout's states as it is claimed and beats ``beats`` times (each moving its deadline), then succeeds."""
    client, runner = EventFactory(role="client"), EventFactory(role="runner")
    rid, now = f"ro-{time.time_ns()}", time.time()
    events = [RolloutEnqueued(meta=client.meta(rid), input={}, start_time=now,
                              config=AvroRolloutConfig(unresponsive_seconds=unresponsive_s)),
              AttemptStarted(meta=runner.meta(rid), attempt_id="at-1", sequence_id=1, start_time=now),
              *(AttemptHeartbeat(meta=runner.meta(rid), attempt_id="at-1", time=now + i) for i in range(beats)),
              AttemptStatusChanged(meta=runner.meta(rid), attempt_id="at-1", status="succeeded", time=now + beats)]
    states: list[RolloutState] = []
    state = None
    for event in events:
        state = fold.apply(state, event).state
        assert state is not None
        states.append(state)
    return rid, states


def test_a_finished_rollout_keeps_no_cached_state_and_no_timer(settings: Settings) -> None:
    processor = lifecycle.LifecycleProcessor(settings)
    try:
        rid, states = _states(unresponsive_s=600, beats=3)
        for state in states[:-1]:
            processor._remember(rid, state)
            processor._arm(rid, state, 0)
        assert rid in processor._states and rid in processor._deadlines
        processor._remember(rid, states[-1])
        processor._arm(rid, states[-1], 0)
        assert rid not in processor._states and rid not in processor._deadlines
    finally:
        processor.outputs.close()


def test_the_timer_heap_keeps_few_superseded_entries(settings: Settings) -> None:
    """Every heartbeat moves a deadline: the superseded entry stays in the heap (lazy deletion) until the heap holds
    mostly those, then only the live ones are kept."""
    processor = lifecycle.LifecycleProcessor(settings)
    try:
        beats = 3 * lifecycle.HEAP_SLACK
        rid, states = _states(unresponsive_s=600, beats=beats)
        for state in states[1:-1]:  # the claim and every beat: a deadline each
            processor._arm(rid, state, 0)
        assert len(processor._deadlines) == 1
        assert len(processor._heap) <= 2 + lifecycle.HEAP_SLACK
        assert (processor._deadlines[rid][0], rid) in processor._heap  # the live one is kept
    finally:
        processor.outputs.close()
