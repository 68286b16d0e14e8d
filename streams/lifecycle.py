"""The rollout-lifecycle processor (Faust): folds lifecycle events into a table of rollout state.

For each event on ``rollout-events``: decode, apply the pure fold, store the new state in the table (its changelog
makes it durable), publish the snapshot on ``rollout-state`` and, when the rollout goes on offer, an offer on
``rollout-offers``. Undecodable or rejected events go to ``rollout-events.dlq`` with the reason.

At-least-once: a redelivered event is recognised by the fold (per-producer sequence) and changes nothing.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

import faust

from litstream.infra import health
from litstream.infra.profiles import faust_profile
from litstream.infra.settings import Settings
from litstream.infra.topics import LIFECYCLE_TABLE, Topics
from litstream.schemas.codec import Codec, DecodeError, default_codec
from litstream.schemas.events import (
    AttemptHeartbeat,
    AttemptStarted,
    AttemptStatusChanged,
    EventFactory,
    RolloutEnqueued,
    RolloutOffered,
    RolloutStatusChanged,
)

from . import fold
from .deadletter import DeadLetter
from .state import RolloutState

log = logging.getLogger("litstream.lifecycle")
LIFECYCLE_EVENTS = (RolloutEnqueued, RolloutStatusChanged, AttemptStarted, AttemptHeartbeat, AttemptStatusChanged)
ROLE = "lifecycle"


def faust_broker_credentials(settings: Settings) -> dict[str, Any]:
    """Faust/aiokafka settings for SASL/TLS from the same environment as every other client."""
    if settings.kafka_security_protocol == "PLAINTEXT":
        return {}
    import ssl

    ctx = ssl.create_default_context(cafile=settings.kafka_ssl_cafile) if "SSL" in settings.kafka_security_protocol else None
    if settings.kafka_sasl_mechanism:
        password = settings.kafka_sasl_password.get_secret_value() if settings.kafka_sasl_password else ""
        creds = faust.SASLCredentials(username=settings.kafka_sasl_username or "", password=password,
                                      mechanism=settings.kafka_sasl_mechanism, ssl_context=ctx)
        return {"broker_credentials": creds}
    return {"broker_credentials": faust.SSLCredentials(ctx)}


class LifecycleProcessor:
    """The thin Faust edge around the pure fold."""

    def __init__(self, settings: Settings, codec: Codec | None = None) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.codec = codec or default_codec(settings.schema_registry_url)
        self.factory = EventFactory(settings.producer_id, role=ROLE)
        self.stats = {"applied": 0, "duplicates": 0, "dead_letters": 0}
        datadir = (settings.data_dir / "faust" / self.topics.faust_app_id).resolve()
        datadir.mkdir(parents=True, exist_ok=True)
        self.app = faust.App(
            self.topics.faust_app_id,
            broker=[f"kafka://{s}" for s in settings.bootstrap_servers.split(",")],
            topic_partitions=settings.partitions,
            processing_guarantee="at_least_once",
            topic_allow_declare=False,  # every topic comes from the catalogue (litstream topics create)
            topic_disable_leader=True,
            web_enabled=False,
            store="memory://",
            datadir=str(datadir),
            **faust_profile(settings),
            **faust_broker_credentials(settings),
        )
        raw = {"key_serializer": "raw", "value_serializer": "raw"}
        self.source = self.app.topic(self.topics.rollout_events, partitions=settings.partitions, **raw)
        self.state_topic = self.app.topic(self.topics.state, partitions=settings.partitions, **raw)
        self.offers_topic = self.app.topic(self.topics.offers, partitions=settings.partitions, **raw)
        self.dlq_topic = self.app.topic(self.topics.dlq("rollout-events"), **raw)
        # Values are the state as JSON (the app's default serializer); the changelog makes them durable.
        self.table = self.app.Table(LIFECYCLE_TABLE, partitions=settings.partitions, key_type=str)
        self.app.agent(self.source, name="fold")(self._fold_stream)
        self.app.timer(interval=2.0)(self._beat)

    async def _beat(self) -> None:
        health.beat(self.settings.data_dir, ROLE, **self.stats)

    async def _fold_stream(self, stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            await self.handle(msg.key, msg.value, msg.topic, msg.partition, msg.offset)

    async def handle(self, key: bytes | None, value: bytes | None, topic: str, partition: int, offset: int) -> None:
        def dead(reason: str, kind: str) -> DeadLetter:
            return DeadLetter(topic, partition, offset, key, value, reason, ROLE, kind)

        try:
            event = self.codec.decode(value)
        except DecodeError as exc:
            await self._dead_letter(dead(exc.reason, "decode"))
            return
        if not isinstance(event, LIFECYCLE_EVENTS):
            await self._dead_letter(dead(f"{type(event).__name__} does not belong on {topic}", "invalid"))
            return
        if key is None or key.decode(errors="replace") != event.rollout_id:
            await self._dead_letter(dead(f"message key {key!r} is not the event's rollout id {event.rollout_id}",
                                         "invalid"))
            return
        try:
            raw_state = self.table.get(event.rollout_id)
            state = RolloutState.model_validate(raw_state) if raw_state is not None else None
            outcome = fold.apply(state, event)
        except Exception as exc:  # a bug in the fold must not stop the partition
            log.exception("fold failed for %s", event.rollout_id)
            await self._dead_letter(dead(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}", "error"))
            return
        if outcome.state is not None and outcome.state is not state:
            self.table[event.rollout_id] = outcome.state.model_dump(mode="json")
        if outcome.duplicate:
            self.stats["duplicates"] += 1
            return
        if not outcome.accepted:
            await self._dead_letter(dead(outcome.reason or "rejected", "rejected"))
            return
        self.stats["applied"] += 1
        assert outcome.state is not None
        rid = outcome.state.rollout_id.encode()
        await self.state_topic.send(key=rid, value=self.codec.encode(outcome.state.snapshot()))
        if outcome.offer is not None:
            s = outcome.state
            offer = RolloutOffered(meta=self.factory.meta(s.rollout_id), attempt_sequence=outcome.offer.attempt_sequence,
                                   input=s.input, mode=s.mode, resources_id=s.resources_id, config=s.config,
                                   metadata=s.metadata)
            await self.offers_topic.send(key=rid, value=self.codec.encode(offer))

    async def _dead_letter(self, letter: DeadLetter) -> None:
        self.stats["dead_letters"] += 1
        log.warning("dead letter from %s[%d]@%d: %s", letter.source_topic, letter.partition, letter.offset,
                    letter.reason.splitlines()[0])
        await self.dlq_topic.send(key=letter.key, value=letter.value, headers=letter.headers())




def run(settings: Settings, loglevel: str = "info") -> None:
    """Run the processor in the foreground until interrupted."""
    from faust.worker import Worker

    processor = LifecycleProcessor(settings)
    health.beat(settings.data_dir, ROLE, starting=True, started=time.time())
    Worker(processor.app, loglevel=loglevel, quiet=True).execute_from_commandline()
