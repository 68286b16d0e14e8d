"""OpenTelemetry attribute values: checked when they are given, so a bad value fails at the call site.

Size limits keep one span within one Kafka message (1 MB by default on the broker and the client): an attribute
value holds at most ``MAX_VALUE_BYTES`` (a string's UTF-8 bytes; a list's elements together, 8 bytes a number), a
span at most ``MAX_ATTRIBUTES`` attributes of at most ``MAX_SPAN_ATTRIBUTE_BYTES`` together (keys included, with its
events' and links' attributes). The SDK refuses more at the call that sets it; the gateway answers 400 naming the
attribute (``/v1/agl/spans``) or refuses the span in OTLP's ``partialSuccess`` (``/v1/traces``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from litstream.schemas.events import AttrValue
from litstream.schemas.models import Span

INT64 = (-(2**63), 2**63 - 1)  # Avro long: a larger int could not be written to the topic
PRIMITIVES = (bool, int, float, str)
MAX_ATTRIBUTES = 1024  # per span (OpenTelemetry's default is 128; LLM spans carry prompts message by message)
MAX_VALUE_BYTES = 256 << 10  # one attribute value
MAX_SPAN_ATTRIBUTE_BYTES = 768 << 10  # all of a span's attributes, keys included: room left in a 1 MB message


def _text_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", errors="surrogatepass"))


def value_size(value: Any) -> int:
    """Bytes an attribute value takes: a string's UTF-8 length, 8 for a number, a list's elements added up."""
    if isinstance(value, str):
        return _text_size(value)
    if isinstance(value, (list, tuple)):
        return sum(value_size(v) for v in value)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    return 0 if value is None else 8


def _over_value_limit(size: int, where: str) -> ValueError:
    return ValueError(f"{where}: value of {size} bytes is over the {MAX_VALUE_BYTES}-byte limit of an attribute")


def check_value_size(value: Any, where: str) -> None:
    size = value_size(value)
    if size > MAX_VALUE_BYTES:
        raise _over_value_limit(size, where)


def attributes_bytes(attributes: Mapping[str, Any] | None) -> int:
    return sum(_text_size(str(k)) + value_size(v) for k, v in (attributes or {}).items())


def check_span_attributes(attributes: Mapping[str, Any], where: str = "attributes", extra_bytes: int = 0) -> None:
    """A whole span's attributes against the limits (``extra_bytes``: its events' and links' attributes)."""
    if len(attributes) > MAX_ATTRIBUTES:
        raise ValueError(f"{where}: {len(attributes)} attributes, over the limit of {MAX_ATTRIBUTES} per span")
    total = extra_bytes
    for key, value in attributes.items():
        size = value_size(value)
        if size > MAX_VALUE_BYTES:
            raise _over_value_limit(size, f"{where}[{key!r}]")
        total += _text_size(str(key)) + size
    if total > MAX_SPAN_ATTRIBUTE_BYTES:
        raise ValueError(f"{where}: {total} bytes of attributes, over the limit of {MAX_SPAN_ATTRIBUTE_BYTES} per span")


def check_span_limits(span: Span) -> None:
    """A span from outside (gateway, OTLP) against the limits; its events', links' and resource's attributes count
    in the span's total."""
    extra = sum(attributes_bytes(e.attributes) for e in span.events)
    extra += sum(attributes_bytes(link.attributes) for link in span.links) + attributes_bytes(span.resource.attributes)
    check_span_attributes(span.attributes, "attributes", extra)


def check_int(value: int, where: str) -> int:
    if not INT64[0] <= value <= INT64[1]:
        raise ValueError(f"{where}: integer {value} does not fit in 64 bits")
    return value


def check_leaf(value: Any, where: str) -> AttrValue:
    """An OpenTelemetry attribute value: a primitive, or a homogeneous list of primitives (None elements allowed)."""
    if isinstance(value, str):
        check_value_size(value, where)
        return value
    if isinstance(value, (bool, float)):
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
        check_value_size(value, where)
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
