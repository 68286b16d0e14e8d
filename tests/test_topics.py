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
