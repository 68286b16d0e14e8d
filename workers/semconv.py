"""The reference's span names and attribute keys (Agent Lightning 0.3's ``semconv.py``), and the reward's
attributes: shared by the SDK's ``AttemptContext.emit_reward`` and the emitters."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from litstream.schemas.events import AttrValue

from .attributes import flatten_attributes

ANNOTATION_SPAN = "agentlightning.annotation"
MESSAGE_SPAN = "agentlightning.message"
OBJECT_SPAN = "agentlightning.object"
EXCEPTION_SPAN = "agentlightning.exception"
REWARD_ATTR = "agentlightning.reward"
MESSAGE_BODY_ATTR = "agentlightning.message.body"
OBJECT_TYPE_ATTR = "agentlightning.object.type"
OBJECT_LITERAL_ATTR = "agentlightning.object.literal"
OBJECT_JSON_ATTR = "agentlightning.object.json"
TAG_ATTR = "agentlightning.tag"
LINK_ATTR = "agentlightning.link"


def reward_value(value: Any, argument: str) -> float:
    if not isinstance(value, numbers.Real):  # bool and int are Real: they become floats, as in the reference
        raise TypeError(f"{argument} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{argument} must be a finite number, got {number!r}")
    return number


def reward_dimensions(reward: float | Mapping[str, float], primary_key: str | None) -> list[dict[str, Any]]:
    """Reward dimensions with the primary first: a scalar is the single dimension ``primary``."""
    if not isinstance(reward, Mapping):
        return [{"name": "primary", "value": reward_value(reward, "reward")}]
    if primary_key is None:
        raise ValueError("reward is a dict of dimensions, so primary_key= must name the primary one")
    values: dict[str, float] = {}
    for key, value in reward.items():
        if not isinstance(key, str):
            raise TypeError(f"reward: dimension names must be strings, got {key!r}")
        values[key] = reward_value(value, f"reward[{key!r}]")
    if primary_key not in values:
        raise ValueError(f"primary_key {primary_key!r} is not a key of reward (keys: {sorted(values)})")
    return [{"name": primary_key, "value": values[primary_key]}] + [
        {"name": k, "value": v} for k, v in values.items() if k != primary_key]


def reward_attributes(reward: float | Mapping[str, float], primary_key: str | None) -> dict[str, AttrValue]:
    """The attributes of a reward's annotation span; validates the reward first (``TypeError`` / ``ValueError``)."""
    return flatten_attributes({REWARD_ATTR: reward_dimensions(reward, primary_key)})
