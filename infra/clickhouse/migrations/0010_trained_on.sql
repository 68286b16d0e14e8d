-- What trained each policy version, from the lineage topic: one row per (version, triplet). A version's record sent
-- again (a restarted trainer publishes its newest version again) replaces its rows; query with FINAL.
CREATE TABLE IF NOT EXISTS trained_on
(
    version UInt32,                                             -- N of policy-vN, the version this step made
    run_id LowCardinality(String),                              -- the training run ('' for none)
    resources_id LowCardinality(String),
    rollout_id String CODEC(ZSTD(1)),
    attempt_id String CODEC(ZSTD(1)),
    `index` UInt32,                                             -- the triplet's index in its attempt
    group_id String CODEC(ZSTD(1)),                             -- the GRPO group: the task
    generated_by Nullable(UInt32),                              -- the version that generated it
    reward Float64,
    turns UInt32,                                               -- the attempt's triplets joined into its sample
    window LowCardinality(String),                              -- why the step's window closed
    trained_time DateTime64(6),
    event_id String CODEC(ZSTD(1)),
    ingested_ns UInt64 CODEC(Delta(8), ZSTD(1))
)
ENGINE = ReplacingMergeTree(ingested_ns)
ORDER BY (version, rollout_id, attempt_id, `index`)
SETTINGS index_granularity = 8192
