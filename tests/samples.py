"""One valid instance of every record type, for codec and pipeline tests."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from litstream.schemas.events import (
    AttemptHeartbeat,
    AttemptSnapshot,
    AttemptStarted,
    AttemptStatusChanged,
    AttemptUpdated,
    AvroModel,
    EventFactory,
    NamedResourceRecord,
    ResourceRecord,
    ResourcesPublished,
    RolloutEnqueued,
    RolloutOffered,
    RolloutSnapshot,
    RolloutStatusChanged,
    RolloutUpdated,
    SequenceRequested,
    SpanEventRecord,
    SpanLinkRecord,
    SpanRecorded,
    TrainedSample,
    TripletEmitted,
    VersionTrained,
    WorkerObserved,
)

F = EventFactory(role="test")
RID = "ro-000000000001"


def span(seq: int = 1, rollout_id: str = RID, attempt_id: str = "at-00000001") -> SpanRecorded:
    start = time.time_ns()
    return SpanRecorded(
        meta=F.meta(rollout_id), attempt_id=attempt_id, sequence_id=seq, trace_id="ab" * 16,
        span_id=f"{seq:016x}", parent_id=None, name="chat", kind="CLIENT", status_code="OK",
        start_time_ns=start, end_time_ns=start + 1000,
        attributes={"gen_ai.request.model": "m", "n": 3, "x": 0.5, "ok": True, "list": [1, 2], "none": None},
        events=[SpanEventRecord(name="e", timestamp_ns=time.time_ns(), attributes={"k": "v"})],
        links=[SpanLinkRecord(trace_id="cd" * 16, span_id="ef" * 8)],
        resource=ResourceRecord(attributes={"service.name": "svc"}), resources_id="rs-1",
    )


def all_records() -> list[AvroModel]:
    now = time.time()
    return [
        RolloutEnqueued(meta=F.meta(RID), input={"q": "1+1", "nested": [1, {"a": None}]}, start_time=now,
                        mode="train", config={"timeout_seconds": 5.0, "max_attempts": 3,
                                              "retry_condition": ["failed", "timeout"]}, metadata={"k": 1}),
        RolloutStatusChanged(meta=F.meta(RID), status="cancelled", time=now, reason="user"),
        AttemptStarted(meta=F.meta(RID), attempt_id="at-1", sequence_id=1, start_time=now, worker_id="w"),
        AttemptHeartbeat(meta=F.meta(RID), attempt_id="at-1", time=now),
        AttemptStatusChanged(meta=F.meta(RID), attempt_id="at-1", status="failed", time=now, error="boom"),
        span(),
        ResourcesPublished(event_id="e1", resources_id="rs-1", producer_id="p", producer_seq=1,
                           timestamp_ns=time.time_ns(), version=1, create_time=now, update_time=now,
                           resources={"main_llm": NamedResourceRecord(resource_type="llm", endpoint="http://x/v1",
                                                                      model="m", sampling_parameters={"t": 0.7})}),
        TripletEmitted(meta=F.meta(RID), attempt_id="at-1", group_id="g", index=0, prompt_token_ids=[1, 2],
                       response_token_ids=[3], response_logprobs=[-0.1], reward=1.0, metadata={"m": "x"}),
        RolloutOffered(meta=F.meta(RID), attempt_sequence=1, input={"q": 1}),
        RolloutUpdated(meta=F.meta(RID), time=now, set_fields=["metadata", "mode", "config"], mode="val",
                       metadata={"k": 2}, config={"max_attempts": 2}),
        AttemptUpdated(meta=F.meta(RID), attempt_id="at-1", time=now, set_fields=["status", "metadata"],
                       status="running", metadata={"x": 1}),
        SequenceRequested(meta=F.meta(RID), attempt_id="at-1", count=5),
        WorkerObserved(**F.stamp(), worker_id="w1", time=now, kind="heartbeat", heartbeat_stats={"load": 0.5}),
        VersionTrained(**F.stamp(), resources_id="policy-v2", version=2, time=now, window="count",
                       samples=[TrainedSample(rollout_id=RID, attempt_id="at-1", group_id="g", index=0, turns=2,
                                              policy_version=1, reward=0.5)]),
        RolloutSnapshot(rollout_id=RID, version=3, input=[1, 2], start_time=now, status="running",
                        attempts=[AttemptSnapshot(attempt_id="at-1", sequence_id=1, start_time=now)],
                        updated_ns=time.time_ns()),
    ]


def stored_history(data_dir: Path, tables: dict[str, Any]) -> Path:
    """A data dir whose ClickHouse (chDB) holds ``tables`` (name -> Arrow table) as the pipeline would have stored
    them; returns the data dir."""
    from litstream.infra.clickhouse import ClickHouse
    from litstream.infra.settings import Settings

    ch = ClickHouse(Settings(data_dir=data_dir).resolved_clickhouse_dsn, role="test")
    try:
        ch.migrate()
        for name, table in tables.items():
            ch.insert_arrow(name, table)
    finally:
        ch.close()
    return data_dir

