"""What the triplet processor keeps between messages (pure, no Kafka): spans per attempt, which attempts have
ended, when an ended attempt can be finalized, and how far each partition may be committed.

**Finalization rule.** An attempt has ended when a rollout snapshot shows it ``succeeded``, ``failed``,
``timeout`` or ``unresponsive`` (or its rollout finished). Its *cut* is that snapshot's record time plus
``settle_ms``. It is finalized once the spans partition has been read past the cut: either read to its end
(end-of-partition event) at a wall time ``fetch_margin_ms`` after the cut, or a span written after the cut has
been read. (Writers make an attempt's spans durable before its terminal event, so every span of the attempt is
appended before the snapshot that ends it; a span created after the cut was appended after them.) The attempt's
triplets come from its spans written before the cut; a span of it written later, or
read after it was finalized, is a *late span* (dead letter). Attempts of a partition are finalized in the order
they ended, so an ended attempt never waits behind a later one.

**Commit rule.** A spans partition is committed up to the first span of the oldest attempt still buffered, a
rollout-state partition up to the snapshot that ended the oldest attempt not yet finalized. A restart re-reads
from there: the state partition from its beginning up to the committed offset only rebuilds the map of ended
attempts (*warm-up*, spans paused meanwhile), everything after it is live. A re-read span of an attempt that
ended before the committed offset was finalized before the restart: it is skipped if written before the cut
(``replayed``), a late span otherwise.

**Orphans.** Spans whose attempt no snapshot has named ``orphan_after_ms`` after its first span (an unknown
rollout, or an attempt id its rollout never had) would hold the spans commit back forever: such an attempt is let
go as an orphan (one dead letter, and its later spans are late spans). Spans recorded outside any attempt (rollout
id ``UNATTRIBUTED``) are counted and skipped: they belong to no rollout.

**Memory.** Besides the buffered spans (capped in bytes), the collector remembers per rollout which attempts its
snapshots named and when each ended, for the ``remember_rollouts`` rollouts it heard of last, and the
``remember_finalized`` attempts it finalized last. Past those counts the oldest are forgotten: a span of such an
old attempt is then reported as an orphan rather than a late span, still a dead letter with its reason.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from litstream.schemas.events import RolloutSnapshot, SpanRecorded
from litstream.schemas.models import FINISHED
from litstream.schemas.policy_versions import UNATTRIBUTED

ENDED = frozenset({"succeeded", "failed", "timeout", "unresponsive"})
AttemptKey = tuple[str, str]


@dataclass
class BufferedSpan:
    span: SpanRecorded
    raw: bytes
    offset: int
    ts_ms: int


@dataclass
class Attempt:
    rollout_id: str
    attempt_id: str
    partition: int
    first_offset: int | None = None
    first_ts_ms: int | None = None
    spans: dict[str, BufferedSpan] = field(default_factory=dict)
    size: int = 0
    dropped: str | None = None  # why its spans were let go (over a cap); it yields no triplet
    cut_ms: int | None = None
    state_offset: int | None = None
    snapshot: RolloutSnapshot | None = None

    @property
    def key(self) -> AttemptKey:
        return (self.rollout_id, self.attempt_id)

    def split(self) -> tuple[list[BufferedSpan], list[BufferedSpan]]:
        """(spans written before the cut, late spans), each in offset order."""
        ordered = sorted(self.spans.values(), key=lambda b: b.offset)
        cut = self.cut_ms if self.cut_ms is not None else 2**63
        return [b for b in ordered if b.ts_ms < cut], [b for b in ordered if b.ts_ms >= cut]


@dataclass(frozen=True)
class Notice:
    """Something to report as a dead letter: ``kind`` is late_span | over_cap | buffer_full | orphan."""

    kind: str
    reason: str
    attempt: Attempt
    span: BufferedSpan | None = None


@dataclass
class RolloutMemo:
    """What the collector remembers of one rollout: the attempts its snapshots named, and each ended one's cut."""

    named: set[str] = field(default_factory=set)
    cuts: dict[str, int] = field(default_factory=dict)


@dataclass
class Limits:
    settle_ms: int = 2000
    fetch_margin_ms: int = 250
    max_spans_per_attempt: int = 20_000
    max_bytes_per_attempt: int = 64 << 20
    max_buffer_bytes: int = 512 << 20
    remember_finalized: int = 50_000
    remember_rollouts: int = 50_000
    orphan_after_ms: int = 600_000


class Collector:
    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.pending: dict[AttemptKey, Attempt] = {}
        self.rollouts: OrderedDict[tuple[int, str], RolloutMemo] = OrderedDict()  # (partition, rollout), LRU
        self.finalized_here: OrderedDict[AttemptKey, int] = OrderedDict()  # -> its partition
        self.warm_until: dict[int, int] = {}  # state partition -> first live offset
        self.spans_pos: dict[int, int] = {}
        self.state_pos: dict[int, int] = {}
        self.newest_span_ms: dict[int, int] = {}
        self.buffer_bytes = 0
        self.counts = {"spans": 0, "snapshots": 0, "duplicates": 0, "replayed": 0, "dropped_spans": 0,
                       "partition_mismatch": 0, "unattributed": 0}

    # -- input ----------------------------------------------------------------------------------------------

    def add_span(self, partition: int, offset: int, ts_ms: int, span: SpanRecorded, raw: bytes) -> list[Notice]:
        self.spans_pos[partition] = offset + 1
        self.newest_span_ms[partition] = max(self.newest_span_ms.get(partition, 0), ts_ms)
        self.counts["spans"] += 1
        if span.rollout_id == UNATTRIBUTED:  # a call outside any attempt (the policy server's plain /v1): no rollout
            self.counts["unattributed"] += 1
            return []
        key = (span.rollout_id, span.attempt_id)
        buffered = BufferedSpan(span, raw, offset, ts_ms)
        attempt = self.pending.get(key)
        if attempt is None:
            memo = self.rollouts.get((partition, span.rollout_id))
            cut = memo.cuts.get(span.attempt_id) if memo is not None else None
            if key in self.finalized_here or (cut is not None and ts_ms >= cut):
                return [Notice("late_span", "late span: its attempt was already turned into triplets",
                               Attempt(span.rollout_id, span.attempt_id, partition), buffered)]
            if cut is not None:  # ended before the committed offset: finalized before a restart
                self.counts["replayed"] += 1
                return []
            attempt = self.pending[key] = Attempt(span.rollout_id, span.attempt_id, partition, first_offset=offset)
        if attempt.first_offset is None:
            attempt.first_offset = offset
        if attempt.first_ts_ms is None:
            attempt.first_ts_ms = ts_ms
        if attempt.dropped is not None:
            self.counts["dropped_spans"] += 1
            return []
        if span.span_id in attempt.spans:
            self.counts["duplicates"] += 1
            return []
        attempt.spans[span.span_id] = buffered
        attempt.size += len(raw)
        self.buffer_bytes += len(raw)
        notices: list[Notice] = []
        lim = self.limits
        if len(attempt.spans) > lim.max_spans_per_attempt or attempt.size > lim.max_bytes_per_attempt:
            notices.append(self._drop(attempt, "over_cap", f"attempt over the span cap ({len(attempt.spans)} spans, "
                                      f"{attempt.size} bytes; limits {lim.max_spans_per_attempt} spans, "
                                      f"{lim.max_bytes_per_attempt} bytes)"))
        while self.buffer_bytes > lim.max_buffer_bytes:
            largest = max((a for a in self.pending.values() if a.dropped is None), key=lambda a: a.size)
            notices.append(self._drop(largest, "buffer_full", f"span buffer full ({self.buffer_bytes} bytes > "
                                      f"{lim.max_buffer_bytes}): the largest attempt ({largest.size} bytes) let go"))
        return notices

    def _drop(self, attempt: Attempt, kind: str, reason: str) -> Notice:
        self.buffer_bytes -= attempt.size
        self.counts["dropped_spans"] += len(attempt.spans)
        attempt.spans, attempt.size, attempt.dropped = {}, 0, reason
        return Notice(kind, reason, attempt)

    def add_snapshot(self, partition: int, offset: int, ts_ms: int, snap: RolloutSnapshot) -> None:
        self.state_pos[partition] = offset + 1
        self.counts["snapshots"] += 1
        memo = self._memo(partition, snap.rollout_id)
        memo.named.update(a.attempt_id for a in snap.attempts)
        known = memo.cuts
        live = offset >= self.warm_until.get(partition, 0)
        for a in snap.attempts:
            if a.attempt_id in known or not (a.status in ENDED or snap.status in FINISHED):
                continue
            if (snap.rollout_id, a.attempt_id) in self.finalized_here:  # its memo was forgotten, not the attempt
                known[a.attempt_id] = ts_ms + self.limits.settle_ms
                continue
            cut = ts_ms + self.limits.settle_ms
            known[a.attempt_id] = cut
            if live:
                key = (snap.rollout_id, a.attempt_id)
                attempt = self.pending.setdefault(key, Attempt(snap.rollout_id, a.attempt_id, partition))
                if attempt.partition != partition:  # spans and state not co-partitioned: a misconfigured producer
                    self.counts["partition_mismatch"] += 1
                attempt.cut_ms, attempt.state_offset, attempt.snapshot = cut, offset, snap

    def _memo(self, partition: int, rollout_id: str) -> RolloutMemo:
        key = (partition, rollout_id)
        memo = self.rollouts.get(key)
        if memo is None:
            memo = self.rollouts[key] = RolloutMemo()
            while len(self.rollouts) > self.limits.remember_rollouts:
                self.rollouts.popitem(last=False)
        else:
            self.rollouts.move_to_end(key)
        return memo

    def warming(self, partition: int) -> bool:
        return self.state_pos.get(partition, 0) < self.warm_until.get(partition, 0)

    # -- output ---------------------------------------------------------------------------------------------

    def ready(self, partition: int, now_ms: int, at_end: bool) -> list[Attempt]:
        """Ended attempts of the partition that can be finalized now, in the order they ended."""
        ended = sorted((a for a in self.pending.values() if a.partition == partition and a.state_offset is not None),
                       key=lambda a: a.state_offset or 0)
        out: list[Attempt] = []
        newest = self.newest_span_ms.get(partition, -1)
        for a in ended:
            cut = a.cut_ms or 0
            if not ((at_end and now_ms >= cut + self.limits.fetch_margin_ms) or newest >= cut):
                break
            out.append(a)
        return out

    def orphans(self, now_ms: int) -> list[Attempt]:
        """Attempts with spans that no snapshot named within ``orphan_after_ms`` of their first span."""
        out = []
        for a in self.pending.values():
            if a.state_offset is not None or a.first_ts_ms is None:
                continue
            if now_ms - a.first_ts_ms < self.limits.orphan_after_ms:
                continue
            memo = self.rollouts.get((a.partition, a.rollout_id))
            if memo is None or a.attempt_id not in memo.named:
                out.append(a)
        return out

    def finalized(self, attempt: Attempt) -> None:
        self.pending.pop(attempt.key, None)
        self.buffer_bytes -= attempt.size
        self.finalized_here[attempt.key] = attempt.partition
        while len(self.finalized_here) > self.limits.remember_finalized:
            self.finalized_here.popitem(last=False)

    def commit_points(self) -> tuple[dict[int, int], dict[int, int]]:
        """(spans partition -> offset, state partition -> offset) safe to commit now."""
        spans = dict(self.spans_pos)
        state = {p: pos for p, pos in self.state_pos.items() if not self.warming(p)}
        for a in self.pending.values():
            if a.first_offset is not None and a.partition in spans:
                spans[a.partition] = min(spans[a.partition], a.first_offset)
            if a.state_offset is not None and a.partition in state:
                state[a.partition] = min(state[a.partition], a.state_offset)
        return spans, state

    def forget(self, partitions: set[int]) -> None:
        """Partitions this process no longer owns: their next owner re-reads what was not committed."""
        for key in [k for k, a in self.pending.items() if a.partition in partitions]:
            self.buffer_bytes -= self.pending.pop(key).size
        for memo_key in [k for k in self.rollouts if k[0] in partitions]:
            del self.rollouts[memo_key]
        # What was finalized here is re-read from the commit points like the rest: if the partitions come back,
        # its spans are replayed (ended before the committed snapshot) or finalized again (same triplet ids).
        for done in [k for k, p in self.finalized_here.items() if p in partitions]:
            del self.finalized_here[done]
        for p in partitions:
            for table in (self.warm_until, self.spans_pos, self.state_pos, self.newest_span_ms):
                table.pop(p, None)

    @property
    def buffered_spans(self) -> int:
        return sum(len(a.spans) for a in self.pending.values())
