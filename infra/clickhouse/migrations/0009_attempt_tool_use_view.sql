-- One row per attempt: its reward (the last one it emitted) beside its tool use, so attempts that used a tool
-- compare with those that did not:
--   SELECT used_tool, count() AS attempts, avg(reward) AS mean_reward FROM attempt_tool_use GROUP BY used_tool
-- llm_calls: its LLM spans; tool_calls: the calls the model made; tool_executions / tool_errors: execute_tool
-- spans and those that ended in error; malformed: answers that began a call and did not parse; invalid_arguments:
-- arguments that are not a JSON object; tools: the tools named. Calls the policy endpoint served outside any
-- attempt (rollout 'unattributed') are no attempt and are left out.
CREATE VIEW IF NOT EXISTS attempt_tool_use AS
SELECT a.rollout_id AS rollout_id, a.attempt_id AS attempt_id, a.reward AS reward, a.llm_calls AS llm_calls,
       ifNull(t.calls, 0) AS tool_calls, ifNull(t.executions, 0) AS tool_executions,
       ifNull(t.errors, 0) AS tool_errors, a.malformed AS malformed, ifNull(t.invalid, 0) AS invalid_arguments,
       ifNull(t.tools, []) AS tools, tool_calls + tool_executions > 0 AS used_tool
FROM (SELECT rollout_id, attempt_id, argMaxIf(reward, sequence_id, reward IS NOT NULL) AS reward,
             countIf(SpanAttributes['gen_ai.operation.name'] IN ('chat', 'text_completion', 'generate_content')
                     OR SpanName LIKE 'chat %' OR SpanName LIKE 'text_completion %') AS llm_calls,
             sum(toUInt64OrZero(SpanAttributes['litstream.tool_calls.malformed'])) AS malformed
      FROM spans FINAL
      WHERE rollout_id != 'unattributed'
      GROUP BY rollout_id, attempt_id) AS a
LEFT JOIN (SELECT rollout_id, attempt_id, countIf(source = 'llm') AS calls, countIf(source = 'execution') AS executions,
                  countIf(source = 'execution' AND status = 'Error') AS errors, countIf(NOT arguments_json) AS invalid,
                  groupUniqArray(tool_name) AS tools
           FROM tool_calls
           GROUP BY rollout_id, attempt_id) AS t
ON a.rollout_id = t.rollout_id AND a.attempt_id = t.attempt_id
