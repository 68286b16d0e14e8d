"""The topic catalogue on the real broker."""

from __future__ import annotations

from litstream.infra.kafka import admin, create_topics, missing_topics
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics, physical_topics


def test_every_catalogue_topic_exists_with_its_partitions(settings: Settings) -> None:
    meta = admin(settings).list_topics(timeout=10).topics
    for t in physical_topics(settings):
        assert t.name in meta, t.name
        assert len(meta[t.name].partitions) == t.partitions, t.name
    assert missing_topics(settings) == []


def test_create_is_idempotent(settings: Settings) -> None:
    assert create_topics(settings) == []


def test_per_rollout_topics_are_co_partitioned(settings: Settings) -> None:
    t = Topics(settings.topic_prefix)
    meta = admin(settings).list_topics(timeout=10).topics
    counts = {len(meta[name].partitions) for name in (t.rollout_events, t.spans, t.offers, t.state,
                                                       t.lifecycle_changelog)}
    assert counts == {settings.partitions}
    assert len(meta[t.resources].partitions) == 1


def test_every_data_topic_has_a_dead_letter_companion(settings: Settings) -> None:
    names = {t.name for t in physical_topics(settings)}
    for t in physical_topics(settings):
        if t.spec is not None and t.spec.dlq:
            assert f"{t.name}.dlq" in names


def test_topics_get_their_retention_and_overrides_apply(settings: Settings) -> None:
    from litstream.infra.topics import DAY_MS

    configs = {t.name: t.config for t in physical_topics(settings)}
    t = Topics(settings.topic_prefix)
    assert configs[t.rollout_events]["retention.ms"] == "-1"  # the source of truth is kept
    assert configs[t.spans]["retention.ms"] == str(7 * DAY_MS)
    assert configs[t.offers]["retention.ms"] == str(DAY_MS)
    changed = settings.model_copy(update={"topic_retention_ms": {"spans": 3_600_000, "spans.dlq": -1}})
    configs = {t.name: t.config for t in physical_topics(changed)}
    assert configs[t.spans]["retention.ms"] == "3600000" and configs[t.dlq("spans")]["retention.ms"] == "-1"


def test_a_retention_for_an_unknown_topic_is_a_clear_error(settings: Settings) -> None:
    import pytest

    with pytest.raises(ValueError, match="unknown topics \\['span'\\]"):
        physical_topics(settings.model_copy(update={"topic_retention_ms": {"span": 1000}}))
    with pytest.raises(ValueError, match="-1 to keep forever"):
        physical_topics(settings.model_copy(update={"topic_retention_ms": {"spans": 0}}))
