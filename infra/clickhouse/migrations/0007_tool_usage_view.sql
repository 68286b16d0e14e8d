-- Calls per tool: how often the model called it (calls), how often the agent ran it (executions) and how those
-- went (execution_errors: the tool raised; invalid_arguments: arguments that are not a JSON object), in how many
-- attempts, and the mean time a run took (NULL without a run).
CREATE VIEW IF NOT EXISTS tool_usage AS
SELECT tool_name,
       countIf(source = 'llm') AS calls,
       countIf(source = 'execution') AS executions,
       countIf(source = 'execution' AND status = 'Error') AS execution_errors,
       countIf(NOT arguments_json) AS invalid_arguments,
       uniqExact(rollout_id, attempt_id) AS attempts,
       avgIfOrNull(Duration / 1e6, source = 'execution') AS mean_execution_ms
FROM tool_calls
GROUP BY tool_name
