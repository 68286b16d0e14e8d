-- Tool calls, one row per call: those the model made (source 'llm': the calls in an LLM span's answer,
-- gen_ai.completion.0.tool_calls as the policy endpoint records them, else the tool_call parts of
-- gen_ai.output.messages) and those the agent ran (source 'execution': execute_tool spans, the SDK's tool_span).
-- arguments_json is 1 when the arguments parse as a JSON object. A view over spans FINAL: nothing is stored twice.
CREATE VIEW IF NOT EXISTS tool_calls AS
SELECT Timestamp, rollout_id, attempt_id, sequence_id, SpanId, resources_id, 'llm' AS source,
       JSONExtractString(call, 'name') AS tool_name, JSONExtractString(call, 'id') AS call_id,
       if(JSONType(call, 'arguments') = 'String', JSONExtractString(call, 'arguments'),
          JSONExtractRaw(call, 'arguments')) AS arguments,
       isValidJSON(arguments) AND JSONType(arguments) = 'Object' AS arguments_json,
       '' AS result, StatusCode AS status, Duration,
       SpanAttributes['litstream.constrained'] = 'true' AS constrained
FROM spans FINAL
ARRAY JOIN if(mapContains(SpanAttributes, 'gen_ai.completion.0.tool_calls'),
              JSONExtractArrayRaw(SpanAttributes['gen_ai.completion.0.tool_calls']),
              arrayFilter(p -> JSONExtractString(p, 'type') = 'tool_call',
                          arrayFlatten(arrayMap(m -> JSONExtractArrayRaw(m, 'parts'),
                                                JSONExtractArrayRaw(SpanAttributes['gen_ai.output.messages']))))) AS call
WHERE mapContains(SpanAttributes, 'gen_ai.completion.0.tool_calls')
   OR mapContains(SpanAttributes, 'gen_ai.output.messages')
UNION ALL
SELECT Timestamp, rollout_id, attempt_id, sequence_id, SpanId, resources_id, 'execution' AS source,
       SpanAttributes['gen_ai.tool.name'] AS tool_name, SpanAttributes['gen_ai.tool.call.id'] AS call_id,
       SpanAttributes['gen_ai.tool.call.arguments'] AS arguments,
       isValidJSON(arguments) AND JSONType(arguments) = 'Object' AS arguments_json,
       SpanAttributes['gen_ai.tool.call.result'] AS result, StatusCode AS status, Duration, toUInt8(0) AS constrained
FROM spans FINAL
WHERE SpanAttributes['gen_ai.operation.name'] = 'execute_tool'
