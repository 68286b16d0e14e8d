"""Running the policy server as a process of the stack: Kafka clients, the routes, the version follower."""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from litstream.infra import health
from litstream.infra.metrics import StatSeries
from litstream.infra.service import AsyncProcess, Service
from litstream.infra.settings import Settings
from litstream.streams.log_writer import LogWriter

from .app import DEFAULT_MAX_TOKENS, PolicyServer, build_app
from .backends import Backend
from .recorder import RESERVE_WAIT_S, SpanRecorder
from .sampling_defaults import SamplingDefaults
from .versions import VersionFollower

log = logging.getLogger("litstream.policy_server")
ROLE = "policy-server"
SERIES = {  # the server's counters on /metrics (read from its health report at scrape time)
    "calls": StatSeries("litstream_policy_calls", "Calls the policy endpoint answered"),
    "tool_calls": StatSeries("litstream_policy_tool_calls", "Tool calls parsed from the policy's answers"),
    "tool_calls_malformed": StatSeries("litstream_policy_tool_calls_malformed", "Tool calls the policy began and "
                                       "did not write as a well-formed call of an offered tool (returned as content)"),
}


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8090
    publish: bool = False  # republish each policy version as a ProxyLLM at public_url
    public_url: str | None = None  # how runners reach this server; default http://<host>:<port>
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)  # until a version publishes its own

    def endpoint(self, bound_port: int) -> str:
        """The ``.../v1`` URL runners are given (the bound port when ``port`` 0 asked for any free one). A server
        bound to every interface is named by its host name: 0.0.0.0 reaches nobody from another machine."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        return (self.public_url or f"http://{host}:{bound_port}").rstrip("/").removesuffix("/v1") + "/v1"


class RunningServer:
    """The server started in the current event loop (tests and benchmarks use it directly)."""

    def __init__(self, settings: Settings, backend: Backend, options: ServerOptions) -> None:
        self.settings = settings
        self.options = options
        # One producer for spans, heartbeats and reservations; the log writer's replica answers reservations after
        # one trip and tells which attempts are running (it holds those and the newest finished rollouts).
        self.log = LogWriter(settings, wait_s=RESERVE_WAIT_S, keep_finished=settings.store_keep_finished)
        self.producer, self.rollouts = self.log.events, self.log.rollouts
        self.recorder = SpanRecorder(self.producer, self.log, service_name=ROLE)
        token = settings.policy_server_token.get_secret_value() if settings.policy_server_token else None
        self.server = PolicyServer(backend, self.recorder, default_max_tokens=options.default_max_tokens,
                                   api_key=token, defaults=options.sampling)
        self.follower: VersionFollower | None = None
        self._runner: web.AppRunner | None = None
        self.port = options.port

    async def start(self) -> None:
        self._runner = web.AppRunner(build_app(self.server), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.host, self.options.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []  # the bound port, when 0 asked for any free one
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        endpoint = self.options.endpoint(self.port) if self.options.publish else None
        self.follower = VersionFollower(self.settings, self.producer, self.server.backend, public_endpoint=endpoint,
                                        api_key=self.server.api_key, on_sampling=self.server.follow_defaults)

    @property
    def base_url(self) -> str:
        return f"http://{self.options.host}:{self.port}/v1"

    def report(self) -> Mapping[str, Any]:
        follower = getattr(self, "follower", None)  # set once the server listens
        return {"url": self.base_url, "version": self.server.backend.version,
                "endpoint": follower.public_endpoint if follower is not None else None, **self.server.stats,
                **self.recorder.stats}

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self.follower is not None:
            self.follower.close()
        await self.log.close()  # delivers what is queued; its connections go now
        self.server.backend.close()


class PolicyServerProcess(AsyncProcess):
    """The policy server as a process of the stack: its health beat (about once a second) names its URL."""

    def __init__(self, settings: Settings, backend: Backend, options: ServerOptions) -> None:
        self.running = RunningServer(settings, backend, options)
        super().__init__(health.Heartbeat(settings.data_dir, ROLE, self.running.report, every_s=1.0))

    def report(self) -> Mapping[str, Any]:
        return self.running.report()

    async def start(self) -> None:
        running, backend = self.running, self.running.server.backend
        await running.start()
        log.info("policy server on %s (model %s, version %d)", running.base_url, backend.model_name,
                 backend.version)
        print(f"policy server on {running.base_url} (model {backend.model_name}, version {backend.version})",
              flush=True)

    async def shutdown(self) -> None:
        await self.running.stop()


def run(settings: Settings, backend: Backend, options: ServerOptions) -> None:
    """Serve in the foreground until SIGINT/SIGTERM."""
    Service(settings, ROLE, series=SERIES, ready_when_built=False).run(
        lambda s: PolicyServerProcess(s, backend, options))
