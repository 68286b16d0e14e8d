-- Retention counts from when a span was stored, not from when it started: with the TTL on the span's own start
-- time, ClickHouse drops a span older than the TTL at insert (after the API answered 201), so a late upload of
-- old traces, or a clock far behind, lost data behind a success code. ingested_ns is set by the sink at insert.
ALTER TABLE spans MODIFY TTL toDateTime(intDiv(ingested_ns, 1000000000)) + toIntervalDay({ttl_days})
