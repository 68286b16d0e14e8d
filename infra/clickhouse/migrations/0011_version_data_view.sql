-- version_data: what trained each policy version, one row per triplet, with the version that generated it and
-- how many versions old it was:  SELECT group_id, count(), avg(reward) FROM version_data WHERE version = 14
-- GROUP BY group_id
CREATE VIEW IF NOT EXISTS version_data AS
SELECT l.version AS version, l.group_id AS group_id, l.rollout_id AS rollout_id, l.attempt_id AS attempt_id,
       l.`index` AS `index`, l.generated_by AS generated_by, l.version - l.generated_by AS staleness,
       l.reward AS reward, l.window AS window, l.trained_time AS trained_time, t.prompt_text AS prompt_text,
       t.response_text AS response_text
FROM trained_on AS l FINAL
LEFT JOIN (SELECT rollout_id, attempt_id, `index`, prompt_text, response_text FROM triplets FINAL) AS t
ON l.rollout_id = t.rollout_id AND l.attempt_id = t.attempt_id AND l.`index` = t.`index`
