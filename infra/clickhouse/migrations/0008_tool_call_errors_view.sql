-- Tool calls that failed to parse, one row each: kind 'malformed' is an LLM call whose answer began a tool call
-- and did not parse (litstream.tool_calls.malformed, the policy endpoint's count under tool_choice auto; `text` is
-- the answer it returned as content), kind 'arguments_not_json' a call (source 'llm') or a tool's run (source
-- 'execution') whose arguments are not a JSON object (`text` holds them).
CREATE VIEW IF NOT EXISTS tool_call_errors AS
SELECT Timestamp, rollout_id, attempt_id, sequence_id, SpanId, 'malformed' AS kind, 'llm' AS source,
       '' AS tool_name, '' AS call_id, toUInt64OrZero(SpanAttributes['litstream.tool_calls.malformed']) AS count,
       SpanAttributes['gen_ai.completion.0.content'] AS text
FROM spans FINAL
WHERE toUInt64OrZero(SpanAttributes['litstream.tool_calls.malformed']) > 0
UNION ALL
SELECT Timestamp, rollout_id, attempt_id, sequence_id, SpanId, 'arguments_not_json' AS kind, source, tool_name,
       call_id, toUInt64(1) AS count, arguments AS text
FROM tool_calls
WHERE NOT arguments_json
