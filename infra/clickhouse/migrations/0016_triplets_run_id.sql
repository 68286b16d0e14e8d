-- The training run each row belongs to ('' for none, or rows written before runs were recorded; docs/history.md).
ALTER TABLE triplets ADD COLUMN IF NOT EXISTS run_id LowCardinality(String) DEFAULT ''
