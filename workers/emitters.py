"""Emitters: record rewards, annotations, messages, objects and exceptions as spans of the active attempt.

The span names and attribute keys are Agent Lightning 0.3's (``agentlightning/emitter``, ``semconv.py``), so its
readers (``get_reward_value``, the triplet adapters) understand what lands on the ``spans`` topic:

==================  ==============================  ==========================================================
emitter             span name                       attributes
==================  ==============================  ==========================================================
``emit_reward``     ``agentlightning.annotation``   ``agentlightning.reward.{i}.name`` / ``.value`` (primary 0)
``emit_annotation`` ``agentlightning.annotation``   the flattened dict
``emit_message``    ``agentlightning.message``      ``agentlightning.message.body``
``emit_object``     ``agentlightning.object``       ``agentlightning.object.type`` + ``.literal`` or ``.json``
``emit_exception``  ``agentlightning.exception``    ``exception.type``, ``.message``, ``.escaped``, ``.stacktrace``
``tool_span``       ``execute_tool {name}``         ``gen_ai.tool.name``, ``gen_ai.tool.call.id`` / ``.arguments``
                                                    / ``.result`` (a ``with`` block: the tool's run is the span)
==================  ==============================  ==========================================================

Every emitter validates its arguments before anything is produced: a bad value raises ``TypeError`` or
``ValueError`` naming the argument at the call site, and the topic never sees it. Nested attribute dicts are
flattened with dotted keys; lists of primitives stay leaf lists, lists holding dicts or lists are expanded by index.

The emitters record into the *active attempt*: the :class:`AttemptContext` set with :func:`attempt_context` (the
runner sets it around the agent call). It lives in a context variable, so asyncio tasks inherit it; a thread started
by the agent does not, unless it runs in ``contextvars.copy_context()``.
"""

from __future__ import annotations

import base64
import json
import traceback
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from litstream.schemas.events import AttrValue

from .attributes import PRIMITIVES, check_leaf, flatten_attributes
from .sdk import (
    AttemptContext,
    SpanHandle,
    ToolExecution,
    attempt_context,
    current_attempt,
    tool_call_attributes,
)
from .semconv import (
    ANNOTATION_SPAN,
    EXCEPTION_SPAN,
    LINK_ATTR,
    MESSAGE_BODY_ATTR,
    MESSAGE_SPAN,
    OBJECT_JSON_ATTR,
    OBJECT_LITERAL_ATTR,
    OBJECT_SPAN,
    OBJECT_TYPE_ATTR,
    TAG_ATTR,
    reward_attributes,
)

__all__ = ["attempt_context", "current_context", "flatten_attributes", "check_leaf"]

class NoActiveAttemptError(RuntimeError):
    """An emitter was called outside an attempt."""


# --- the active attempt ------------------------------------------------------------------------------------


def current_context() -> AttemptContext | None:
    """The active attempt, or None outside one (set by the runner, or by ``attempt_context``)."""
    return current_attempt()


def _require_context(emitter: str) -> AttemptContext:
    ctx = current_attempt()
    if ctx is None:
        raise NoActiveAttemptError(
            f"{emitter}() was called outside an attempt: call it from an agent run by `litstream runner`, or wrap "
            "the code in `with litstream.workers.emitters.attempt_context(ctx):` with the attempt's AttemptContext"
        )
    return ctx


def make_tag_attributes(tags: Sequence[str]) -> dict[str, AttrValue]:
    """``["a", "b"]`` -> ``{"agentlightning.tag.0": "a", "agentlightning.tag.1": "b"}``."""
    if isinstance(tags, str) or not isinstance(tags, Sequence):
        raise TypeError(f"tags must be a list of strings, got {type(tags).__name__}")
    for i, tag in enumerate(tags):
        if not isinstance(tag, str):
            raise TypeError(f"tags[{i}] must be a string, got {type(tag).__name__}")
    return {f"{TAG_ATTR}.{i}": tag for i, tag in enumerate(tags)}


def make_link_attributes(links: Mapping[str, str]) -> dict[str, AttrValue]:
    """``{"gen_ai.response.id": "resp-1"}`` -> ``agentlightning.link.0.key_match`` / ``.value_match``: this span
    refers to the span whose attribute ``key_match`` equals ``value_match``."""
    if not isinstance(links, Mapping):
        raise TypeError(f"links must be a dict of attribute key -> value, got {type(links).__name__}")
    out: dict[str, AttrValue] = {}
    for i, (key, value) in enumerate(links.items()):
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"links: keys and values must be strings, got {key!r}: {value!r}")
        out[f"{LINK_ATTR}.{i}.key_match"] = key
        out[f"{LINK_ATTR}.{i}.value_match"] = value
    return out


# --- recording ---------------------------------------------------------------------------------------------


def _record(ctx: AttemptContext, name: str, attributes: dict[str, AttrValue]) -> SpanHandle:
    """A span with no duration of its own and status OK, as the reference's ``create_span`` makes them; its parent
    is the SDK span open at the call, if any."""
    with ctx.span(name, attributes) as handle:
        handle.status_code = "OK"
    return handle


def _merge(base: dict[str, AttrValue], attributes: Mapping[str, Any] | None) -> dict[str, AttrValue]:
    if attributes is None:
        return base
    return {**base, **flatten_attributes(attributes)}


def emit_reward(reward: float | Mapping[str, float], *, primary_key: str | None = None,
                attributes: Mapping[str, Any] | None = None) -> SpanHandle:
    """Record a reward: a scalar, or a dict of dimensions whose ``primary_key`` is the primary reward.

    >>> emit_reward({"task": 1.0, "efficiency": 0.8}, primary_key="task", attributes=make_tag_attributes(["fast"]))
    """
    attrs = _merge(reward_attributes(reward, primary_key), attributes)
    ctx = _require_context("emit_reward")
    ctx.note_reward(reward, primary_key)
    return _record(ctx, ANNOTATION_SPAN, attrs)


def emit_annotation(annotation: Mapping[str, Any]) -> SpanHandle:
    """Record a free-form annotation (rewards, tags, links, ...), flattened into attributes."""
    attrs = flatten_attributes(annotation, "annotation")
    return _record(_require_context("emit_annotation"), ANNOTATION_SPAN, attrs)


def emit_message(message: str, attributes: Mapping[str, Any] | None = None) -> SpanHandle:
    """Record a text message."""
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__}")
    attrs = _merge({MESSAGE_BODY_ATTR: message}, attributes)
    return _record(_require_context("emit_message"), MESSAGE_SPAN, attrs)


def type_name(obj: Any) -> str:
    """The qualified class name; builtins bare (``dict``, ``int``)."""
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def encode_object(obj: Any) -> dict[str, AttrValue]:
    """The object attributes: literals as ``str()``, bytes as base64, anything else as strict JSON."""
    if isinstance(obj, (bytes, bytearray)):
        return {OBJECT_TYPE_ATTR: "bytes", OBJECT_LITERAL_ATTR: base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, PRIMITIVES):
        return {OBJECT_TYPE_ATTR: type_name(obj), OBJECT_LITERAL_ATTR: str(obj)}
    try:
        # allow_nan=False: NaN/Infinity are not JSON, and the readers downstream parse strictly.
        serialised = json.dumps(obj, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"obj: a {type_name(obj)} cannot be serialised as JSON ({exc}); emit a dict, list or "
                        "literal instead") from None
    return {OBJECT_TYPE_ATTR: type_name(obj), OBJECT_JSON_ATTR: serialised}


def emit_object(obj: Any, attributes: Mapping[str, Any] | None = None) -> SpanHandle:
    """Record any JSON-serialisable object (or a str/int/float/bool/bytes literal)."""
    attrs = _merge(encode_object(obj), attributes)
    return _record(_require_context("emit_object"), OBJECT_SPAN, attrs)


def emit_exception(exc: BaseException, attributes: Mapping[str, Any] | None = None) -> SpanHandle:
    """Record an exception with the OpenTelemetry exception attributes (type named as the OTel SDK names it)."""
    if not isinstance(exc, BaseException):
        raise TypeError(f"exc must be an exception instance, got {type(exc).__name__}")
    stacktrace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    attrs = _merge({"exception.type": type_name(exc), "exception.message": str(exc), "exception.escaped": True,
                    "exception.stacktrace": stacktrace}, attributes)
    return _record(_require_context("emit_exception"), EXCEPTION_SPAN, attrs)


def tool_span(name: str, arguments: str | Mapping[str, Any],
              call_id: str | None = None) -> AbstractContextManager[ToolExecution]:
    """Record a tool's execution in the active attempt (:meth:`AttemptContext.tool_span`)::

        with tool_span("get_weather", call.function.arguments, call_id=call.id) as t:
            t.result(get_weather(**json.loads(call.function.arguments)))
    """
    tool_call_attributes(name, arguments, call_id)  # checked before the attempt: a bad call raises TypeError first
    return _require_context("tool_span").tool_span(name, arguments, call_id)
