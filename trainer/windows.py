"""Windows over the triplet stream: which samples train together, and what is dropped on the way (no torch).

Policy, in the order a triplet meets it:

1. **Duplicates** (same ``(rollout_id, attempt_id, index)``; delivery is at-least-once) are counted and dropped.
2. **No reward** (``reward is None``) and **malformed** (no response tokens, log-probs not one per response token,
   non-finite reward) are counted and dropped.
3. **Stale**: the policy version is parsed from ``policy_version`` (``policy-vN`` or ``N``), else from
   ``resources_id``; a triplet older than ``current - max_staleness`` is dropped. Unversioned triplets are kept
   (counted) unless ``accept_unversioned`` is off. Staleness is checked again when a window closes.
4. **Late**: a member of a group that was already trained is dropped (its group was normalised without it).
5. Otherwise it joins its group's buffer.

A window closes when ``max_samples`` buffered samples belong to complete groups (``group_size`` members), when
the buffer holds ``overflow_factor * max_samples`` samples in all, or when ``max_seconds`` have passed since it
opened — whichever comes first (count windows set one, time windows the other). At close, complete groups
train. An incomplete group is carried to the next window so its missing members can still arrive, at most
``max_carry`` times; after that it trains if it has ``min_group_size`` members (default 2: a group of one has
no advantage) and is dropped otherwise. ``flush`` trains every group of at least ``min_group_size`` at once.
Every decision is counted in ``WindowStats``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from litstream.schemas.events import TripletEmitted
from litstream.schemas.policy_versions import parse_policy_version

from .samples import GrammarSpan, Sample
from .trajectories import JoinStats, join_attempt


@dataclass
class Group:
    group_id: str
    samples: list[Sample] = field(default_factory=list)
    carried: int = 0  # windows it has been carried over


@dataclass
class Window:
    number: int
    groups: list[Group]
    reason: str  # "count" | "overflow" | "time" | "flush"

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]


@dataclass
class WindowConfig:
    group_size: int = 4
    max_samples: int | None = 32  # count window: samples in complete groups
    max_seconds: float | None = None  # time window
    min_group_size: int = 2
    max_carry: int = 2
    max_staleness: int | None = 2  # None: never stale
    accept_unversioned: bool = True
    overflow_factor: int = 4
    dedupe_capacity: int = 200_000
    # One sample per attempt, its turns joined (trainer/trajectories.py), instead of one per LLM call.
    trajectories: bool = True

    def __post_init__(self) -> None:
        if self.max_samples is None and self.max_seconds is None:
            raise ValueError("set max_samples (count window), max_seconds (time window) or both")
        if self.min_group_size < 1 or self.group_size < self.min_group_size:
            raise ValueError("need 1 <= min_group_size <= group_size")


@dataclass
class WindowStats:
    received: int = 0
    accepted: int = 0
    duplicates: int = 0
    no_reward: int = 0
    malformed: int = 0
    stale: int = 0  # at arrival
    stale_at_close: int = 0
    unversioned: int = 0
    late: int = 0
    windows: int = 0
    empty_windows: int = 0
    trained_samples: int = 0
    trained_groups: int = 0
    partial_groups_trained: int = 0
    carried_groups: int = 0
    dropped_small_groups: int = 0
    dropped_small_samples: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def summary(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.as_dict().items() if v)


def triplet_version(t: TripletEmitted) -> int | None:
    for raw in (t.policy_version, t.resources_id):
        if raw is None:
            continue
        v = parse_policy_version(raw)
        if v is not None:
            return v
        if raw.isdigit():
            return int(raw)
    return None


def to_sample(t: TripletEmitted, turn: bool = False) -> Sample:
    """The triplet as a sample; a ``turn`` of an attempt still to be joined may have no reward of its own (NaN)."""
    if t.reward is None and not turn:
        raise ValueError("triplet has no reward")
    drawn = drawn_with(t.metadata)
    lark = t.metadata.get("grammar")
    if drawn["constrained"] and isinstance(lark, str) and lark:
        drawn["grammars"] = (GrammarSpan(0, len(t.response_token_ids), lark),)
    return Sample(rollout_id=t.meta.rollout_id, attempt_id=t.attempt_id, index=t.index, group_id=t.group_id,
                  policy_version=triplet_version(t), prompt_token_ids=tuple(t.prompt_token_ids),
                  response_token_ids=tuple(t.response_token_ids), response_logprobs=tuple(t.response_logprobs),
                  reward=float(t.reward) if t.reward is not None else math.nan, **drawn)


def attempt_calls(t: TripletEmitted) -> int:
    """How many triplets the triplet's attempt gave (``metadata["calls"]``; 1 where it was not recorded)."""
    calls = t.metadata.get("calls")
    return calls if isinstance(calls, int) and not isinstance(calls, bool) and calls > 0 else 1


def drawn_with(metadata: dict[str, Any]) -> dict[str, Any]:
    """The sampling parameters a triplet's LLM span recorded (``metadata["request"]``: the span's
    ``gen_ai.request.*``), as ``Sample`` fields; what is missing or not a number stays unknown."""
    request = metadata.get("request")
    request = request if isinstance(request, dict) else {}
    out: dict[str, Any] = {"constrained": metadata.get("constrained") is True}
    for name in ("temperature", "top_p"):
        value = request.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    top_k = request.get("top_k")
    if isinstance(top_k, int) and not isinstance(top_k, bool):
        out["top_k"] = top_k
    return out


class Windower:
    """Feed triplets with ``add``; call ``poll`` on a timer for time windows; ``set_version`` after each step."""

    def __init__(self, cfg: WindowConfig, current_version: int = 0, now: float = 0.0) -> None:
        self.cfg = cfg
        self.version = current_version
        self.stats = WindowStats()
        self._groups: dict[str, Group] = {}
        self._seen: OrderedDict[tuple[str, str, int], None] = OrderedDict()
        self._trained: OrderedDict[str, None] = OrderedDict()
        self._opened = now
        self._number = 0
        self.joins = JoinStats()
        self._turns: dict[tuple[str, str], list[Sample]] = {}  # trajectory mode: attempts still arriving
        self._turns_missing: dict[tuple[str, str], int] = {}  # their malformed turns, which never will

    # --- intake ------------------------------------------------------------------------------------------

    def set_version(self, version: int) -> None:
        self.version = version

    def add(self, t: TripletEmitted, now: float) -> Window | None:
        """Take one triplet; returns the window it closed, if any."""
        self._accept(t)
        return self._maybe_close(now)

    def add_many(self, triplets: Sequence[TripletEmitted], now: float) -> list[Window]:
        out = []
        for t in triplets:
            w = self.add(t, now)
            if w is not None:
                out.append(w)
        return out

    def poll(self, now: float) -> Window | None:
        """Closes a time window that is due."""
        return self._maybe_close(now)

    def flush(self, now: float) -> Window | None:
        """Closes the current window whatever its size (at shutdown, or to train on what there is)."""
        return self._close(now, "flush")

    @property
    def buffered(self) -> int:
        return sum(len(g.samples) for g in self._groups.values())

    def _accept(self, t: TripletEmitted) -> None:
        st = self.stats
        st.received += 1
        key = (t.meta.rollout_id, t.attempt_id, t.index)
        if key in self._seen:
            st.duplicates += 1
            return
        _remember(self._seen, key, self.cfg.dedupe_capacity)
        malformed = (not t.response_token_ids or len(t.response_logprobs) != len(t.response_token_ids)
                     or not t.prompt_token_ids or (t.reward is not None and not math.isfinite(t.reward)))
        if malformed:
            st.malformed += 1
        calls = attempt_calls(t)
        if self.cfg.trajectories and calls > 1:
            self._take_turn(t, calls, malformed)
            return
        if malformed:
            return
        if t.reward is None:
            st.no_reward += 1
            return
        self._admit(to_sample(t))

    def _take_turn(self, t: TripletEmitted, calls: int, malformed: bool) -> None:
        """Trajectory mode: hold the attempt's turns until all ``calls`` are in (a malformed one counts as in,
        and the rest then stay per call: "missing turn"), then admit the joined sample or the turns."""
        attempt = (t.meta.rollout_id, t.attempt_id)
        turns = self._turns.setdefault(attempt, [])
        if malformed:
            self._turns_missing[attempt] = self._turns_missing.get(attempt, 0) + 1
        else:
            turns.append(to_sample(t, turn=True))
        if len(turns) + self._turns_missing.get(attempt, 0) < calls:
            return
        del self._turns[attempt]
        if self._turns_missing.pop(attempt, 0):
            self.joins.count("missing turn")
            samples = sorted(turns, key=lambda s: s.index)
        else:
            samples = join_attempt(turns, self.joins)
        for sample in samples:
            self._admit(sample)

    def _admit(self, sample: Sample) -> None:
        st = self.stats
        if not math.isfinite(sample.reward):
            st.no_reward += 1
            return
        if sample.policy_version is None:
            if not self.cfg.accept_unversioned:
                st.stale += 1
                return
            st.unversioned += 1
        elif self._is_stale(sample):
            st.stale += 1
            return
        if sample.group_id in self._trained:
            st.late += 1
            return
        st.accepted += 1
        self._groups.setdefault(sample.group_id, Group(sample.group_id)).samples.append(sample)

    def _is_stale(self, s: Sample) -> bool:
        k = self.cfg.max_staleness
        return k is not None and s.policy_version is not None and s.policy_version < self.version - k

    # --- persistence (the checkpoint carries the buffer, so a restart neither loses nor retrains a sample) ---

    def snapshot(self, max_keys: int = 20_000) -> dict[str, Any]:
        """JSON-able state: buffered groups, counters, and the newest ``max_keys`` dedupe / trained keys."""
        return {
            "version": self.version, "number": self._number, "stats": self.stats.as_dict(),
            "groups": [{"group_id": g.group_id, "carried": g.carried, "samples": [asdict(s) for s in g.samples]}
                       for g in self._groups.values()],
            "turns": [asdict(s) for turns in self._turns.values() for s in turns],
            "turns_missing": [[*k, n] for k, n in self._turns_missing.items()],
            "joins": asdict(self.joins),
            "seen": [list(k) for k in list(self._seen)[-max_keys:]],
            "trained": list(self._trained)[-max_keys:],
        }

    @classmethod
    def restore(cls, cfg: WindowConfig, snap: dict[str, Any], now: float = 0.0) -> Windower:
        """The windower ``snapshot`` described; its time window restarts at ``now``."""
        w = cls(cfg, int(snap["version"]), now)
        w._number = int(snap.get("number", 0))
        w.stats = WindowStats(**snap.get("stats", {}))
        for g in snap.get("groups", []):
            samples = [_sample_of(s) for s in g["samples"]]
            w._groups[g["group_id"]] = Group(g["group_id"], samples, int(g.get("carried", 0)))
        for s in snap.get("turns", []):
            turn = _sample_of(s)
            w._turns.setdefault((turn.rollout_id, turn.attempt_id), []).append(turn)
        for rid, aid, n in snap.get("turns_missing", []):
            w._turns_missing[(str(rid), str(aid))] = int(n)
            w._turns.setdefault((str(rid), str(aid)), [])
        w.joins = JoinStats(**snap.get("joins", {}))
        for k in snap.get("seen", []):
            w._seen[(str(k[0]), str(k[1]), int(k[2]))] = None
        for gid in snap.get("trained", []):
            w._trained[str(gid)] = None
        return w

    # --- closing -----------------------------------------------------------------------------------------

    def _maybe_close(self, now: float) -> Window | None:
        cfg = self.cfg
        if cfg.max_samples is not None:
            complete = sum(len(g.samples) for g in self._groups.values() if len(g.samples) >= cfg.group_size)
            if complete >= cfg.max_samples:
                return self._close(now, "count")
            if self.buffered >= cfg.overflow_factor * cfg.max_samples:
                return self._close(now, "overflow")
        if cfg.max_seconds is not None and now - self._opened >= cfg.max_seconds:
            return self._close(now, "time")
        return None

    def _close(self, now: float, reason: str) -> Window | None:
        cfg, st = self.cfg, self.stats
        self._opened = now
        st.windows += 1
        ready: list[Group] = []
        keep: dict[str, Group] = {}
        for gid, g in self._groups.items():
            fresh = [s for s in g.samples if not self._is_stale(s)]
            st.stale_at_close += len(g.samples) - len(fresh)
            g.samples = fresh
            if not fresh:
                continue
            if len(fresh) >= cfg.group_size:
                ready.append(g)
            elif g.carried < cfg.max_carry and reason != "flush":
                g.carried += 1  # still filling: give its members another window to arrive
                st.carried_groups += 1
                keep[gid] = g
            elif len(fresh) >= cfg.min_group_size:
                ready.append(g)
            else:
                st.dropped_small_groups += 1
                st.dropped_small_samples += len(fresh)
                _remember(self._trained, gid, cfg.dedupe_capacity)  # later members would be late too
        self._groups = keep
        if not ready:
            st.empty_windows += 1
            return None
        self._number += 1
        for g in ready:
            _remember(self._trained, g.group_id, cfg.dedupe_capacity)
            st.trained_groups += 1
            st.trained_samples += len(g.samples)
            if len(g.samples) < cfg.group_size:
                st.partial_groups_trained += 1
        return Window(number=self._number, groups=ready, reason=reason)


def _sample_of(saved: dict[str, Any]) -> Sample:
    mask = saved.get("loss_mask")
    return Sample(**{**saved, "prompt_token_ids": tuple(saved["prompt_token_ids"]),
                     "response_token_ids": tuple(saved["response_token_ids"]),
                     "response_logprobs": tuple(saved["response_logprobs"]),
                     "loss_mask": tuple(mask) if mask is not None else None,
                     "grammars": tuple(GrammarSpan(**g) for g in saved.get("grammars", ()))})


def _remember(seen: OrderedDict[Any, None], key: Any, capacity: int) -> None:
    seen[key] = None
    if len(seen) > capacity:
        seen.popitem(last=False)
