"""The policy server in a thread of the test (its own event loop), on the test's broker and topics."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from litstream.infra.kafka import read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.codec import default_codec
from litstream.schemas.events import NamedResourceRecord, ResourcesPublished, SpanRecorded
from litstream.schemas.policy_versions import POLICY_RESOURCE, policy_resources_id
from litstream.trainer.checkpoint import save_checkpoint
from litstream.trainer.engines import TorchEngine
from litstream.trainer.policy import build_policy
from litstream.workers.policy_server.backends import Backend, torch_backend
from litstream.workers.policy_server.process import RunningServer, ServerOptions


class ServerThread:
    def __init__(self, settings: Settings, backend: Backend, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.running = RunningServer(settings, backend, ServerOptions(port=0, **options))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.running.start(), self.loop).result(60)
        assert self.running.follower is not None
        self.running.follower.caught_up(30)
        self.running.rollouts.caught_up(30)

    @property
    def base_url(self) -> str:
        return self.running.base_url

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def call(self, coro: Any, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.call(self.running.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tiny_engine(seed: int = 0, version: int = 0) -> TorchEngine:
    policy = build_policy("tiny", seed=seed)
    return TorchEngine(policy.model, policy.tokenizer, version)


def tiny_backend(seed: int = 0) -> Backend:
    return torch_backend(tiny_engine(seed), "tiny-policy")


def tiny_checkpoint(root: Path, version: int, seed: int) -> Path:
    policy = build_policy("tiny", seed=seed)
    return save_checkpoint(root, policy.model, policy.tokenizer, version, keep_last=None)


def publish_policy(settings: Settings, version: int, checkpoint: Path) -> None:
    events = EventProducer(settings, role="test-trainer")
    now = time.time()
    events.send(events.topics.resources, ResourcesPublished(
        **events.factory.stamp(), resources_id=policy_resources_id(version), version=1, create_time=now,
        update_time=now, resources={POLICY_RESOURCE: NamedResourceRecord(
            resource_type="llm", endpoint=f"torch://{checkpoint}", model="tiny-policy", engine="torch",
            version=version, checkpoint=str(checkpoint), sampling_parameters={"temperature": 1.0})}))
    events.flush()


def spans(settings: Settings) -> list[SpanRecorded]:
    codec = default_codec()
    return [codec.decode_as(m.value(), SpanRecorded) for m in read_to_end(settings, f"{settings.topic_prefix}.spans")]
