"""A runner's progress line: attempts done, their rate, the mean reward and the policy version in use."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Progress:
    """Counts since the start and since the last line (thread-safe: agent slots report from their threads)."""

    started: float = field(default_factory=time.monotonic)
    done: int = 0
    failed: int = 0
    reward_sum: float = 0.0
    rewards: int = 0
    resources_id: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _last_done: int = 0
    _last_time: float = field(default_factory=time.monotonic)

    def record(self, outcome: str, reward: object, resources_id: str | None) -> None:
        with self._lock:
            self.done += 1
            self.failed += outcome == "failed"
            if isinstance(reward, (int, float)) and not isinstance(reward, bool):
                self.reward_sum += float(reward)
                self.rewards += 1
            self.resources_id = resources_id or self.resources_id

    def due(self, now: float, every: float, idle_every: float = 60.0) -> bool:
        """Whether a line is due: ``every`` seconds while attempts finish, ``idle_every`` while none do."""
        with self._lock:
            since = now - self._last_time
            return since >= every and (self.done != self._last_done or since >= idle_every)

    def line(self, now: float | None = None) -> str:
        """One line; the rate is over the time since the previous line."""
        now = time.monotonic() if now is None else now
        with self._lock:
            rate = (self.done - self._last_done) / max(now - self._last_time, 1e-9)
            self._last_done, self._last_time = self.done, now
            mean = f"{self.reward_sum / self.rewards:.3f}" if self.rewards else "-"
            return (f"progress: {self.done} attempts done ({self.failed} failed), {rate:.1f}/s, "
                    f"mean reward {mean}, policy {self.resources_id or '-'}")
