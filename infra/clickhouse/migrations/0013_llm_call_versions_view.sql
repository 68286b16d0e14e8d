-- llm_call_versions: each LLM call the policy endpoint served, with the policy version that served it:
--   SELECT * FROM llm_call_versions WHERE rollout_id = 'ro-...' ORDER BY sequence_id
CREATE VIEW IF NOT EXISTS llm_call_versions AS
SELECT rollout_id, attempt_id, sequence_id, SpanName AS span_name, Timestamp AS time,
       toUInt32OrNull(SpanAttributes['litstream.policy.version']) AS served_by
FROM spans FINAL
WHERE mapContains(SpanAttributes, 'litstream.policy.version')
