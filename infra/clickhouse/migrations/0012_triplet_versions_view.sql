-- triplet_versions: each triplet of a rollout, the version that generated it and the versions it trained
-- (empty: not trained on, yet or ever):  SELECT * FROM triplet_versions WHERE rollout_id = 'ro-...'
CREATE VIEW IF NOT EXISTS triplet_versions AS
SELECT t.rollout_id AS rollout_id, t.attempt_id AS attempt_id, t.`index` AS `index`, t.group_id AS group_id,
       toUInt32OrNull(replaceOne(t.policy_version, 'policy-v', '')) AS generated_by, t.reward AS reward,
       ifNull(l.versions, []) AS trained_into
FROM triplets AS t FINAL
LEFT JOIN (SELECT rollout_id, attempt_id, `index`, groupArray(version) AS versions
           FROM (SELECT version, rollout_id, attempt_id, `index` FROM trained_on FINAL ORDER BY version)
           GROUP BY rollout_id, attempt_id, `index`) AS l
ON t.rollout_id = l.rollout_id AND t.attempt_id = l.attempt_id AND t.`index` = l.`index`
