-- Every rollout as the lifecycle processor last folded it: its snapshots on the rollout-state topic, the newest
-- version kept. The store reads the rollouts its replica no longer holds from here (finished ones beyond its
-- window: docs/guarantees.md), and analysts count by status here without folding events.
-- ReplacingMergeTree keyed by rollout_id, versioned by the fold's version: query with FINAL.
CREATE TABLE IF NOT EXISTS rollouts
(
    rollout_id String CODEC(ZSTD(1)),
    version UInt64,                                             -- accepted events folded into this snapshot
    status LowCardinality(String),
    start_time Float64,                                         -- the reference's float seconds, kept exact
    end_time Nullable(Float64),
    mode LowCardinality(String),
    resources_id LowCardinality(String),
    attempts UInt32,
    updated_ns UInt64 CODEC(Delta(8), ZSTD(1)),
    ingested_ns UInt64 CODEC(Delta(8), ZSTD(1)),
    raw_json String CODEC(ZSTD(3))                              -- the RolloutSnapshot as JSON
)
ENGINE = ReplacingMergeTree(version)
ORDER BY rollout_id
SETTINGS index_granularity = 1024
