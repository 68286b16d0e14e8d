"""When spans call for an ``AttemptHeartbeat``: the one policy of every writer of spans (the store, the SDK, the
OpenTelemetry exporter, the policy endpoint's recorder).

Spans count as heartbeats of their attempt (as in the reference), but the lifecycle processor reads no spans: a
writer sends a heartbeat for an attempt that has new spans at most once per :data:`SPAN_HEARTBEAT_EVERY_S` (enough
for the timers; one per span would make the processor fold every span), each carrying the highest sequence id its
spans used, so the rollout's counter moves past ids chosen by the writer. A writer may ask for one at once
(``urgent``: the beat would start or revive the attempt) or for every pending one (``force``: before the attempt
ends, or on a flush).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

SPAN_HEARTBEAT_EVERY_S = 1.0
FORGET_AFTER_S = 300.0  # an attempt with no span for this long is forgotten (its next span beats at once)
MAX_ATTEMPTS = 100_000  # attempts remembered at most (the oldest go first)

Attempt = tuple[str, str]  # (rollout id, attempt id)


@dataclass
class Beat:
    """An attempt's heartbeat state; what :meth:`SpanBeats.due` returns is a copy to send."""

    rollout_id: str
    attempt_id: str
    max_sequence_id: int | None = None
    worker_id: str | None = None
    pending: bool = False  # spans came since the last beat
    last_sent: float = float("-inf")
    last_span: float = 0.0

    def send(self, now: float) -> Beat:
        """Mark the beat sent at ``now``; the copy to send."""
        self.pending, self.last_sent = False, now
        return Beat(self.rollout_id, self.attempt_id, self.max_sequence_id, self.worker_id)


class SpanBeats:
    """Thread-safe; ``clock`` is monotonic seconds."""

    def __init__(self, every_s: float = SPAN_HEARTBEAT_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._beats: OrderedDict[Attempt, Beat] = OrderedDict()
        self._lock = threading.Lock()

    def spans(self, rollout_id: str, attempt_id: str, max_sequence_id: int | None = None,
              worker_id: str | None = None) -> None:
        """Spans of this attempt were written (the highest sequence id among them, if known)."""
        key = (rollout_id, attempt_id)
        with self._lock:
            beat = self._beats.get(key)
            if beat is None:
                beat = self._beats[key] = Beat(rollout_id, attempt_id)
                while len(self._beats) > MAX_ATTEMPTS:
                    self._beats.popitem(last=False)
            else:
                self._beats.move_to_end(key)
            if max_sequence_id is not None:
                beat.max_sequence_id = max(beat.max_sequence_id or 0, max_sequence_id)
            beat.worker_id = worker_id or beat.worker_id
            beat.pending, beat.last_span = True, self._clock()

    def due(self, force: bool = False, urgent: Callable[[Beat], bool] | None = None) -> list[Beat]:
        """The heartbeats to send now, marked sent: every attempt with new spans whose last beat is
        ``every_s`` old, or any with new spans when ``force`` or ``urgent(beat)``."""
        now = self._clock()
        out: list[Beat] = []
        with self._lock:
            for key, beat in list(self._beats.items()):
                if beat.pending and (force or now - beat.last_sent >= self.every_s
                                     or (urgent is not None and urgent(beat))):
                    out.append(beat.send(now))
                elif not beat.pending and now - beat.last_span > FORGET_AFTER_S:
                    del self._beats[key]
        return out

    def pending(self) -> bool:
        """Whether any attempt has spans its last beat did not cover."""
        with self._lock:
            return any(beat.pending for beat in self._beats.values())

    def due_before_reserving(self, rollout_id: str, attempt_id: str, next_sequence_id: int | None) -> Beat | None:
        """The attempt's held beat, due at once, if its spans used an id the rollout's counter is not past
        (``next_sequence_id``, as the writer's replica folded it; None: not known, so any id): ids the spans chose
        themselves. Spans that used reserved ids leave the beat to its throttle."""
        with self._lock:
            beat = self._beats.get((rollout_id, attempt_id))
            if beat is None or not beat.pending or beat.max_sequence_id is None:
                return None
            if next_sequence_id is not None and beat.max_sequence_id < next_sequence_id:
                return None
            return beat.send(self._clock())

    def due_for(self, rollout_id: str, attempt_id: str, urgent: bool = False) -> Beat | None:
        """:meth:`due` for one attempt only (a writer that beats right after its own spans)."""
        now = self._clock()
        with self._lock:
            beat = self._beats.get((rollout_id, attempt_id))
            if beat is None or not beat.pending or not (urgent or now - beat.last_sent >= self.every_s):
                return None
            return beat.send(now)
