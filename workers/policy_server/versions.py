"""The server follows the policy versions published on ``resources`` and, when asked, publishes itself.

**Following.** The newest publication's LLM resource that carries a ``version`` (the trainer's ``policy-vN``,
``main_llm``) is the policy to serve: the backend switches to it (torch: loads its checkpoint after the batch in
flight; an upstream: records the version its publisher swapped in). A call answered meanwhile finishes on the
weights it started with, and its span names that version.

**Publishing** (``--publish``). Runners give an agent a per-attempt URL only for a ``ProxyLLM`` resource. So
each policy publication is published again under the same resources id with the server in front: ``main_llm``
becomes a ``ProxyLLM`` at this server (model and sampling parameters kept) and the original LLM stays as
``policy_weights`` (the version and checkpoint the server loads). Rollouts stamped with ``policy-vN`` before or
after that read the same id, so every attempt of the version goes through the server; spans and triplets still
name the version. Agents that run the policy in their own process (the toy ``toy_policy_agent``) need the plain
LLM: do not publish when they are the ones running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from litstream.infra.producer import EventProducer
from litstream.infra.service import set_from_thread
from litstream.infra.settings import Settings
from litstream.schemas.events import NamedResourceRecord, ResourcesPublished
from litstream.schemas.models import LLM, ProxyLLM, ResourcesUpdate
from litstream.schemas.policy_versions import POLICY_RESOURCE
from litstream.streams.resources import to_records
from litstream.streams.views import ResourcesView

from .backends import Backend

log = logging.getLogger("litstream.policy_server")
WEIGHTS_RESOURCE = "policy_weights"
CATCH_UP_S = 60.0  # how long a starting server reads the resources topic before it serves what it has


class _Feed(ResourcesView):
    """The resources view, calling ``on_change`` (from its thread) after every publication."""

    def __init__(self, settings: Settings, codec: Any, on_change: Callable[[], None]) -> None:
        self._on_change = on_change
        super().__init__(settings, codec)

    def on_record(self, ev: ResourcesPublished) -> None:
        super().on_record(ev)
        self._on_change()


def policy_llm(update: ResourcesUpdate) -> LLM | None:
    """The versioned LLM of a publication: ``policy_weights`` (republished by a server), else ``main_llm``, else
    the first LLM with a version."""
    res = update.resources
    for name in (WEIGHTS_RESOURCE, POLICY_RESOURCE):
        llm = res.get(name)
        if isinstance(llm, LLM) and llm.version is not None:
            return llm
    return next((r for r in res.values() if isinstance(r, LLM) and r.version is not None), None)


def proxied(update: ResourcesUpdate) -> bool:
    """Whether a server (this one or another) already fronts this publication: then it is left as it is, so two
    publishing servers never take turns republishing it."""
    return any(isinstance(r, ProxyLLM) for r in update.resources.values())


class VersionFollower:
    """Keeps ``backend`` on the latest published policy version; republishes it as a ``ProxyLLM`` if asked."""

    def __init__(self, settings: Settings, producer: EventProducer, backend: Backend, *,
                 public_endpoint: str | None = None, api_key: str | None = None,
                 on_sampling: Callable[[dict[str, Any], str], None] | None = None) -> None:
        self.producer = producer
        self.on_sampling = on_sampling  # told each served version's sampling parameters (the call defaults)
        self.backend = backend
        self.public_endpoint = public_endpoint  # .../v1 of this server, when it publishes itself
        self.api_key = api_key  # published with it, so the agents' clients send it
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._follow(), name="policy-versions")
        self.switches: list[tuple[int, float]] = []  # (version, seconds the switch took)
        self.published: list[str] = []
        self._serving: tuple[int, str | None] | None = None  # the (version, checkpoint) last switched to
        self.view = _Feed(settings, producer.codec, self._changed)

    def _changed(self) -> None:
        """From the view's thread: wake the follower task."""
        set_from_thread(self._loop, self._wake)

    async def _follow(self) -> None:
        # The log as it is first: a server (re)started on a long log serves its newest publication, not each one
        # it reads on the way there.
        await asyncio.to_thread(self.view.caught_up, CATCH_UP_S)
        while True:
            await self._wake.wait()
            self._wake.clear()
            latest = self.view.state.latest
            if latest is None:
                continue
            try:
                await self._apply(latest)
            except Exception as exc:  # a bad publication must not stop the server: it keeps the current version
                log.error("cannot serve %s: %s (still serving version %d)", latest.resources_id, exc,
                          self.backend.version)

    async def _apply(self, update: ResourcesUpdate) -> None:
        llm = policy_llm(update)
        if llm is None or llm.version is None:
            return
        # The first publication seen is loaded even at the same version number: its weights are the trained ones.
        if self._serving != (llm.version, llm.checkpoint) and (self._serving is not None
                                                               or llm.version != self.backend.version
                                                               or llm.checkpoint is not None):
            t0 = time.perf_counter()
            await self.backend.switch(llm.version, llm.checkpoint)
            self._serving = (llm.version, llm.checkpoint)
            self.switches.append((llm.version, time.perf_counter() - t0))
            log.info("serving policy version %d (%s)", llm.version, update.resources_id)
        if self.on_sampling is not None and llm.sampling_parameters:
            self.on_sampling(dict(llm.sampling_parameters), f"policy version {llm.version}'s sampling parameters")
        if self.public_endpoint and not proxied(update):
            self._publish(update, llm)

    def _publish(self, update: ResourcesUpdate, llm: LLM) -> None:
        assert self.public_endpoint is not None
        proxy = ProxyLLM(endpoint=self.public_endpoint, model=llm.model, api_key=self.api_key,
                         sampling_parameters=llm.sampling_parameters)
        others = {k: v for k, v in update.resources.items() if k not in (POLICY_RESOURCE, WEIGHTS_RESOURCE)}
        records: dict[str, NamedResourceRecord] = to_records({POLICY_RESOURCE: proxy, WEIGHTS_RESOURCE: llm, **others})
        now = time.time()
        self.producer.send(self.producer.topics.resources, ResourcesPublished(
            **self.producer.factory.stamp(), resources_id=update.resources_id, version=1,
            create_time=update.create_time, update_time=now, resources=records))
        self.producer.poll(0)
        self.published.append(update.resources_id)
        log.info("published %s through this server (%s)", update.resources_id, self.public_endpoint)

    def caught_up(self, timeout: float = 30.0) -> bool:
        return self.view.caught_up(timeout)

    def close(self) -> None:
        self._task.cancel()
        self.view.close()
