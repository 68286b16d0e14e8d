"""The trainer as a process on a real broker: it trains one version per window, publishes each as policy-vN, and
a SIGKILL at any point costs nothing: the restarted trainer resumes from its newest checkpoint (weights,
optimizer, triplet positions, window buffer) and neither loses nor retrains a window."""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from pathlib import Path

from litstream.app.stack import Stack
from litstream.infra import health
from litstream.infra.broker import KafkaBroker
from litstream.infra.kafka import read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.codec import default_codec
from litstream.schemas.events import EventMeta, ResourcesPublished, TripletEmitted, VersionTrained
from litstream.trainer.checkpoint import latest_checkpoint, list_checkpoints

GROUP, PER_STEP = 2, 2  # window: 2 complete groups of 2 triplets


def _triplets(n_groups: int, rng: random.Random) -> list[TripletEmitted]:
    out = []
    for g in range(n_groups):
        group = f"g-{uuid.uuid4().hex[:8]}"
        for k in range(GROUP):
            rid = f"ro-{uuid.uuid4().hex[:10]}"
            meta = EventMeta(event_id=uuid.uuid4().hex, rollout_id=rid, producer_id="test", producer_seq=1,
                             timestamp_ns=time.time_ns())
            out.append(TripletEmitted(
                meta=meta, attempt_id="at-1", group_id=group, index=0, policy_version="0",
                prompt_token_ids=[257, *(rng.randrange(97, 101) for _ in range(3))],
                response_token_ids=[rng.randrange(97, 101), 258], response_logprobs=[-5.5, -5.6],
                reward=float(k)))  # members differ: every group has an advantage
    return out


def _wait_version(settings: Settings, at_least: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    version = -1
    while time.monotonic() < deadline:
        version = int((health.read(settings.data_dir, "trainer") or {}).get("version", -1))
        if version >= at_least:
            return version
        time.sleep(0.2)
    raise AssertionError(f"trainer at version {version}, expected {at_least}")


def test_trainer_resumes_after_sigkill_without_losing_or_retraining(settings: Settings, tmp_path: Path) -> None:
    ckpts = tmp_path / "ckpts"
    args = ("process", "trainer", "--group-size", str(GROUP), "--groups-per-step", str(PER_STEP),
            "--checkpoints", str(ckpts), "--max-staleness", "100")  # the triplets all claim version 0
    rng = random.Random(0)
    events = EventProducer(settings, role="test")
    batches = [_triplets(3 * PER_STEP, rng), _triplets(3 * PER_STEP, rng)]  # 3 windows each
    with Stack(settings) as stack:
        first = stack.start("trainer", *args)
        for t in batches[0]:
            events.send(events.topics.triplets, t)
        events.flush()
        _wait_version(settings, 2)  # mid-stream: the third window may be anywhere
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
        for t in batches[1]:
            events.send(events.topics.triplets, t)
        events.flush()
        stack.start("trainer-again", *args)
        _wait_version(settings, 6)
        time.sleep(2.0)  # room for a wrong seventh step to show
    # Six windows were produced: exactly six versions, whatever the moment of the kill.
    assert list_checkpoints(ckpts)[-1][0] == 6 and latest_checkpoint(ckpts) == ckpts / "v6"
    codec = default_codec()
    published = {codec.decode_as(m.value(), ResourcesPublished).resources_id
                 for m in read_to_end(settings, f"{settings.topic_prefix}.resources")}
    assert published == {f"policy-v{v}" for v in range(7)}
    # Lineage: each version names the triplets of its window; together every triplet, none twice.
    trained: dict[int, set[str]] = {}
    for m in read_to_end(settings, f"{settings.topic_prefix}.lineage"):
        record = codec.decode_as(m.value(), VersionTrained)  # a version sent again after the kill: the same samples
        samples = {s.rollout_id for s in record.samples}
        assert trained.setdefault(record.version, samples) == samples
    assert sorted(trained) == [1, 2, 3, 4, 5, 6]
    assert all(len(rids) == GROUP * PER_STEP for rids in trained.values())
    assert set().union(*trained.values()) == {t.rollout_id for batch in batches for t in batch}


def test_a_trainer_on_a_stack_made_before_lineage_creates_its_topic(broker: KafkaBroker) -> None:
    """A stack whose topics were created before the lineage topic existed: the trainer creates what is missing
    rather than failing every publication (a crash loop)."""
    from litstream.infra.kafka import missing_topics
    from litstream.infra.topics import Topics
    from litstream.trainer.process import _lineage_topic_ready

    settings = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}")
    lineage = Topics(settings.topic_prefix).lineage
    assert lineage in missing_topics(settings)
    assert _lineage_topic_ready(settings, lineage)
    assert lineage not in missing_topics(settings)
