"""The rollouts as they were at a point of the log, for the dashboard's "as of": replayed with the fold, and kept
for the few points last asked for (a page refreshes every 2 s; a point in the past never changes)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from litstream.infra.settings import Settings
from litstream.schemas.events import RolloutSnapshot
from litstream.streams.replay import Until, log_point, replay

KEPT_POINTS = 4


@dataclass(frozen=True)
class PastPoint:
    """A point asked for: its time (None when given as offsets) and the offsets it names."""

    time: float | None
    offsets: dict[int, int]

    @property
    def label(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time)) if self.time is not None else None
        at = str(Until(offsets=self.offsets))
        return f"{when} (offsets {at})" if when else f"offsets {at}"


class PastStates:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._kept: OrderedDict[tuple[tuple[int, int], ...], dict[str, RolloutSnapshot]] = OrderedDict()
        self._lock = threading.Lock()

    def at(self, until: Until) -> tuple[dict[str, RolloutSnapshot], PastPoint]:
        """The snapshots at ``until`` (blocking: a read of rollout-events up to it, unless kept)."""
        offsets = log_point(self.settings, until)
        key = tuple(sorted(offsets.items()))
        with self._lock:
            snapshots = self._kept.get(key)
        if snapshots is None:
            result = replay(self.settings, until=Until(offsets=offsets))
            snapshots = {rid: state.snapshot() for rid, state in result.states.items()}
            with self._lock:
                self._kept[key] = snapshots
                while len(self._kept) > KEPT_POINTS:
                    self._kept.popitem(last=False)
        return snapshots, PastPoint(until.time, offsets)
