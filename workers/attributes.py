"""OpenTelemetry attribute values: checked when they are given, so a bad value fails at the call site."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from litstream.schemas.events import AttrValue

INT64 = (-(2**63), 2**63 - 1)  # Avro long: a larger int could not be written to the topic
PRIMITIVES = (bool, int, float, str)


def check_int(value: int, where: str) -> int:
    if not INT64[0] <= value <= INT64[1]:
        raise ValueError(f"{where}: integer {value} does not fit in 64 bits")
    return value


def check_leaf(value: Any, where: str) -> AttrValue:
    """An OpenTelemetry attribute value: a primitive, or a homogeneous list of primitives (None elements allowed)."""
    if isinstance(value, (bool, float, str)):
        return value
    if isinstance(value, int):
        return check_int(value, where)
    if isinstance(value, (list, tuple)):
        kinds = {type(v) for v in value if v is not None}
        bad = [v for v in value if v is not None and type(v) not in PRIMITIVES]
        if bad or len(kinds) > 1:
            raise TypeError(f"{where}: a list attribute must hold values of one type among str, bool, int, float "
                            f"(found {sorted(k.__name__ for k in kinds)})")
        for v in value:
            if type(v) is int:
                check_int(v, where)
        return list(value)
    what = "None" if value is None else f"a {type(value).__name__}"
    raise TypeError(f"{where}: {what} is not an OpenTelemetry attribute value "
                    "(str, bool, int, float, or a list of one of them)")


def _nested(value: Any) -> bool:
    return isinstance(value, (Mapping, list, tuple))


def flatten_attributes(attributes: Mapping[str, Any], argument: str = "attributes") -> dict[str, AttrValue]:
    """Flatten nested dicts with dotted keys and validate every value; errors name ``argument`` and the key."""
    if not isinstance(attributes, Mapping):
        raise TypeError(f"{argument} must be a dict of attributes, got {type(attributes).__name__}")
    out: dict[str, AttrValue] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str) or not key:
                    raise TypeError(f"{argument}: keys must be non-empty strings, got {key!r}"
                                    + (f" under {prefix!r}" if prefix else ""))
                walk(f"{prefix}.{key}" if prefix else key, item)
        elif isinstance(value, (list, tuple)) and any(_nested(v) for v in value):
            for i, item in enumerate(value):  # lists of dicts (e.g. reward dimensions) become .0.x, .1.x, ...
                walk(f"{prefix}.{i}", item)
        else:
            out[prefix] = check_leaf(value, f"{argument}[{prefix!r}]")

    walk("", attributes)
    return out
