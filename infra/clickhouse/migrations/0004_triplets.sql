-- Triplets from the triplets topic, one row per (rollout_id, attempt_id, index): a triplet emitted again (a
-- redelivery, or an adapter that re-ran) replaces the earlier row; query with FINAL. No partition key, so rows
-- of the same key always meet in a merge whatever their timestamps.
CREATE TABLE IF NOT EXISTS triplets
(
    timestamp DateTime64(9) CODEC(Delta(8), ZSTD(1)),
    rollout_id String CODEC(ZSTD(1)),
    attempt_id String CODEC(ZSTD(1)),
    `index` UInt32,
    group_id String CODEC(ZSTD(1)),
    policy_version LowCardinality(String),                      -- '' when not a trained policy
    resources_id LowCardinality(String),
    prompt_token_ids Array(Int64) CODEC(ZSTD(1)),
    response_token_ids Array(Int64) CODEC(ZSTD(1)),
    response_logprobs Array(Float64) CODEC(ZSTD(1)),
    prompt_text String CODEC(ZSTD(3)),
    response_text String CODEC(ZSTD(3)),
    reward Nullable(Float64),
    metadata_json String CODEC(ZSTD(3)),
    event_id String CODEC(ZSTD(1)),
    producer_id LowCardinality(String),
    producer_seq UInt64,
    ingested_ns UInt64 CODEC(Delta(8), ZSTD(1))
)
ENGINE = ReplacingMergeTree(ingested_ns)
ORDER BY (rollout_id, attempt_id, `index`)
SETTINGS index_granularity = 8192
