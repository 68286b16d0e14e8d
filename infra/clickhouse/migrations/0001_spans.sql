-- Spans, compatible with the OpenTelemetry Collector ClickHouse exporter's otel_traces table (same column names
-- and types), plus the rollout columns. Ordered for the hot reads: all spans of a rollout in sequence.
-- ReplacingMergeTree keyed by span identity: a redelivered span collapses into one row; query with FINAL
-- (or GROUP BY the key) for exact counts before background merges run.
CREATE TABLE IF NOT EXISTS spans
(
    Timestamp DateTime64(9) CODEC(Delta(8), ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(T64, ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    rollout_id String CODEC(ZSTD(1)),
    attempt_id String CODEC(ZSTD(1)),
    sequence_id UInt64 CODEC(Delta(8), ZSTD(1)),
    resources_id LowCardinality(String) CODEC(ZSTD(1)),
    ingested_ns UInt64 CODEC(Delta(8), ZSTD(1)),
    -- The span as it was recorded (typed attributes, events, links), for lossless reads (query_spans).
    raw_json String CODEC(ZSTD(3)),
    reward Nullable(Float64) MATERIALIZED if(
        SpanName = 'agentlightning.annotation' AND mapContains(SpanAttributes, 'agentlightning.reward.0.value'),
        toFloat64OrNull(SpanAttributes['agentlightning.reward.0.value']), NULL),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_rollout_id rollout_id TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree(ingested_ns)
PARTITION BY toDate(Timestamp)
ORDER BY (rollout_id, attempt_id, sequence_id, SpanId)
TTL toDateTime(Timestamp) + toIntervalDay({ttl_days})
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1
