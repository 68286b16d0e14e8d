"""What a ``rollout-events`` record is to the fold: an event it applies, or why it never reaches it. One rule for
the lifecycle processor (which dead-letters the rest), replay and the store's replica of the fold, so all three
fold the same events."""

from __future__ import annotations

from typing import NamedTuple

from litstream.schemas.codec import Codec, DecodeError
from litstream.schemas.events import Event

from .fold import LIFECYCLE_EVENTS


class Unfoldable(NamedTuple):
    """A record the fold never sees: ``kind`` is the dead letter's (decode, invalid); ``undecodable`` when it is
    no lifecycle event at all (not one keyed by another rollout's id)."""

    kind: str
    reason: str
    undecodable: bool = True


def lifecycle_event(codec: Codec, topic: str, key: bytes | None, value: bytes | None) -> Event | Unfoldable:
    """The record's event, if the fold applies it: decodable, a lifecycle event, keyed by its rollout id."""
    try:
        event = codec.decode(value)
    except DecodeError as exc:
        return Unfoldable("decode", exc.reason)
    if not isinstance(event, LIFECYCLE_EVENTS):
        return Unfoldable("invalid", f"{type(event).__name__} does not belong on {topic}")
    if key is None or key.decode(errors="replace") != event.rollout_id:
        return Unfoldable("invalid", f"message key {key!r} is not the event's rollout id {event.rollout_id}",
                          undecodable=False)
    return event
