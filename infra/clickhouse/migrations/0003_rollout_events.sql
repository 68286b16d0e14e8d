-- Every event of the rollout-events topic (all lifecycle types), one row each, as the log holds it: accepted and
-- rejected events alike (the fold decides; this table records). Failure, retry and timeout rates come from here.
-- ReplacingMergeTree keyed by (rollout_id, event_id): a redelivered event collapses into one row; query with
-- FINAL. The partition is the event's own timestamp, so a redelivery lands in the same partition.
CREATE TABLE IF NOT EXISTS rollout_events
(
    timestamp DateTime64(9) CODEC(Delta(8), ZSTD(1)),          -- meta.timestamp_ns: when it was produced
    event_type LowCardinality(String),                          -- RolloutEnqueued, AttemptStarted, ...
    rollout_id String CODEC(ZSTD(1)),
    attempt_id String CODEC(ZSTD(1)),                           -- '' for rollout-level events
    sequence_id UInt32,                                         -- attempt number (AttemptStarted), else 0
    status LowCardinality(String),                              -- new status of status changes/updates, else ''
    event_time DateTime64(6) CODEC(Delta(8), ZSTD(1)),          -- the event's own clock (time / start_time)
    worker_id String CODEC(ZSTD(1)),
    resources_id LowCardinality(String),
    mode LowCardinality(String),
    error String CODEC(ZSTD(3)),
    event_id String CODEC(ZSTD(1)),
    producer_id LowCardinality(String),
    producer_seq UInt64 CODEC(Delta(8), ZSTD(1)),
    kafka_partition UInt32,
    kafka_offset UInt64 CODEC(Delta(8), ZSTD(1)),               -- log order within the rollout's partition
    ingested_ns UInt64 CODEC(Delta(8), ZSTD(1)),
    raw_json String CODEC(ZSTD(3)),
    INDEX idx_event_id event_id TYPE bloom_filter(0.001) GRANULARITY 1
)
ENGINE = ReplacingMergeTree(ingested_ns)
PARTITION BY toYYYYMM(timestamp)
ORDER BY (rollout_id, event_id)
SETTINGS index_granularity = 8192
