"""The one shape of a long-running process: start, readiness, health, metrics, signals and a clean stop.

Every role of the stack (lifecycle processor, span sink, triplet processor, trainer, runner, gateway, policy
server) is a :class:`Process`: it reports its figures, runs until asked to stop, and stops when asked. Its
bootstrap is one line, ``Service(settings, ROLE, SERIES).run(build)``, and :meth:`Service.run` does the rest in
the same order for all of them:

1. stop with the process that started this one (:func:`~litstream.infra.processes.stop_with_parent`), serve
   ``/metrics`` (before any Kafka client is made: the consumers report their lag only when metrics are served)
   and beat ``starting``;
2. ``build(settings)``: the process, its clients and its state; its figures become metrics (``series``) and it is
   ready (``/readyz``), unless it says so itself once it works (the lifecycle processor after its recovery);
3. SIGTERM and SIGINT call ``process.stop()``, which only asks: the process finishes what it holds and returns
   (unless its framework stops it on those signals itself: Faust's worker does);
4. its last beat says ``stopped``, and a process that has ``close()`` is closed.

The health beats while it runs come from the process's own loop (:class:`~litstream.infra.health.Heartbeat`), so
that a beat means the loop turns; an :class:`AsyncProcess` beats from a task of its event loop.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from . import health, metrics
from .metrics import StatSeries
from .processes import stop_with_parent
from .settings import Settings

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Process(Protocol):
    """What a :class:`Service` runs."""

    def report(self) -> Mapping[str, Any]:
        """The figures every health beat carries (and ``/metrics`` exposes, for the keys of the series)."""
        ...

    def run(self) -> None:
        """Work until :meth:`stop`; then finish what is in hand (flush, commit, drain) and return."""
        ...

    def stop(self) -> None:
        """Ask :meth:`run` to return; safe to call from a signal handler or another thread, more than once."""
        ...


@runtime_checkable
class Closable(Protocol):
    def close(self) -> None: ...


P = TypeVar("P", bound=Process)


@dataclass(frozen=True)
class Service:
    """One long-running process of ``role``: see the module's docstring for what :meth:`run` does, in order."""

    settings: Settings
    role: str
    series: Mapping[str, StatSeries] = field(default_factory=dict)
    ready_when_built: bool = True  # False: the process calls metrics.mark_ready() itself once it works
    own_signals: bool = False  # True: its framework stops it on SIGTERM/SIGINT (Faust's worker)

    def run(self, build: Callable[[Settings], P]) -> None:
        self.start()
        process = build(self.settings)
        if self.series:
            metrics.expose_stats(self.role, process.report, self.series)
        if self.ready_when_built:
            metrics.mark_ready()
        try:
            with self._stop_on_signals(process):
                process.run()
        finally:
            health.beat(self.settings.data_dir, self.role, stopped=True, **process.report())
            if isinstance(process, Closable):
                process.close()

    def start(self) -> None:
        """What comes before the process is built: the parent-death rule, /metrics, the first beat."""
        stop_with_parent()
        metrics.serve(self.settings, self.role)
        health.beat(self.settings.data_dir, self.role, starting=True, started=time.time())

    def _stop_on_signals(self, process: Process) -> AbstractContextManager[None]:
        """SIGTERM and SIGINT ask the process to stop (never raise in it), for as long as it runs."""
        return nullcontext() if self.own_signals else on_stop_signals(process.stop)


def set_from_thread(loop: asyncio.AbstractEventLoop | None, event: asyncio.Event | None) -> None:
    """Set ``event`` of ``loop`` from another thread; nothing when either is missing or the loop has closed
    (nothing is left there to wake)."""
    if loop is None or event is None:
        return
    try:
        loop.call_soon_threadsafe(event.set)
    except RuntimeError:  # the loop is closed
        pass


@contextmanager
def on_stop_signals(handler: Callable[[], None]) -> Iterator[None]:
    """While the block runs, SIGTERM (``kill``, a supervisor's stop) and SIGINT (Ctrl-C) call ``handler``; the
    handlers that were there before come back after. Only the main thread can handle signals: elsewhere (a
    process embedded in a test) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: handler())
    try:
        yield
    finally:
        for sig, prev in previous.items():
            signal.signal(sig, prev)


class AsyncProcess(ABC):
    """A :class:`Process` whose work runs on an event loop of its own (the gateway, the policy server): :meth:`run`
    awaits :meth:`start`, then it is ready and beats health from a task of the loop (so a beat also says the loop
    is not blocked) until :meth:`stop`, which may come from a signal handler or another thread; then
    :meth:`shutdown`. Give it ``Service(..., ready_when_built=False)``: it is ready once it serves."""

    def __init__(self, heartbeat: health.Heartbeat) -> None:
        self.heartbeat = heartbeat
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    @abstractmethod
    def report(self) -> Mapping[str, Any]: ...

    @abstractmethod
    async def start(self) -> None:
        """Start serving and return."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop serving: what is in hand is finished or handed back, connections are closed."""

    def run(self) -> None:
        asyncio.run(self._main())

    def stop(self) -> None:
        self._stopping.set()
        set_from_thread(self._loop, self._wake)

    async def _main(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._stopping.is_set():  # asked before the loop ran
            self._wake.set()
        beats: asyncio.Task[None] | None = None
        try:
            await self.start()
            metrics.mark_ready()
            beats = asyncio.create_task(self._beat(), name="health-beat")
            await self._wake.wait()
        finally:
            if beats is not None:
                beats.cancel()
            await self.shutdown()

    async def _beat(self) -> None:
        while True:
            self.heartbeat()
            await asyncio.sleep(self.heartbeat.every_s)
