"""Reading span attributes the way Agent Lightning 0.3's adapters do (pure helpers, no Kafka).

Flattened keys (``gen_ai.prompt.0.content``) are unflattened into dicts and lists; rewards are read with the
reference's ``get_reward_value`` rules; chat messages written with the OpenTelemetry GenAI conventions
(``gen_ai.input.messages`` / ``gen_ai.output.messages`` JSON) are read too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

REWARD_PREFIX = "agentlightning.reward"
ANNOTATION_SPAN = "agentlightning.annotation"
OPERATION_SPAN = "agentlightning.operation"
OPERATION_NAME = "agentlightning.operation.name"
REWARD_OPERATION = "agentlightning.reward"
AGENTOPS_OUTPUT_KEYS = ("agentops.task.output", "agentops.entity.output")

Attributes = Mapping[str, Any]


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any] | list[Any]:
    """Dotted keys to nested dicts; a dict whose keys are exactly ``0..n-1`` becomes a list (reference rule)."""
    root: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = root
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return _listify(root)  # type: ignore[no-any-return]


def _listify(node: Any) -> Any:
    if isinstance(node, dict):
        for k, v in list(node.items()):
            node[k] = _listify(v)
        if node and all(isinstance(k, str) and k.isdigit() for k in node):
            indices = sorted(int(k) for k in node)
            if indices == list(range(len(indices))):
                return [node[str(i)] for i in range(len(indices))]
        return node
    if isinstance(node, list):
        return [_listify(v) for v in node]
    return node


def under(attributes: Attributes, prefix: str) -> dict[str, Any] | list[Any]:
    """The attributes below ``prefix.`` unflattened (empty when none). A key equal to the prefix itself is left
    to the caller (the reference raises on it; some instrumentations write ``gen_ai.prompt`` as one JSON string)."""
    cut = len(prefix) + 1
    return unflatten({k[cut:]: v for k, v in attributes.items() if k.startswith(prefix + ".")})


def first_unflattened(attributes: Attributes, prefixes: Sequence[str]) -> dict[str, Any] | list[Any] | None:
    for prefix in prefixes:
        found = under(attributes, prefix)
        if found:
            return found
        whole = attributes.get(prefix)
        if isinstance(whole, str):
            parsed = _json(whole)
            if isinstance(parsed, (dict, list)) and parsed:
                return parsed
    return None


def first_str(attributes: Attributes, keys: Sequence[str]) -> str | None:
    """The first of ``keys`` present; a present non-string value counts as absent (the reference only warns)."""
    for key in keys:
        value = attributes.get(key)
        if isinstance(value, str):
            return value
    return None


def int_list(value: Any) -> list[int] | None:
    if isinstance(value, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return list(value)
    return None


def first_int_list(attributes: Attributes, keys: Sequence[str]) -> list[int] | None:
    for key in keys:
        if key in attributes:
            found = int_list(attributes[key])
            if found is not None:
                return found
    return None


def float_list(value: Any) -> list[float] | None:
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value):
        return [float(x) for x in value]
    return None


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, ValueError):
        return None


def reward_dimension_values(attributes: Attributes) -> dict[str, float]:
    """Each named dimension of an ``agentlightning.reward`` list with its value, the primary first ({} when the
    span holds none): ``emit_reward({"answer": 1.0, "tool_call": 1.0}, primary_key="answer")``'s two."""
    if not any(k.startswith(REWARD_PREFIX) for k in attributes):
        return {}
    dims = under(attributes, REWARD_PREFIX)
    out: dict[str, float] = {}
    for dim in dims if isinstance(dims, list) else []:
        value = _number(dim.get("value")) if isinstance(dim, dict) else None
        if value is not None and isinstance(dim.get("name"), str):
            out.setdefault(dim["name"], value)
    return out


def reward_value(name: str, attributes: Attributes) -> float | None:
    """The reference's ``get_reward_value``: (1) ``agentlightning.reward.*`` dimensions, the first is primary;
    (2) an AgentOps output ``{"type": "reward", "value": x}``; (3) a legacy ``reward`` on an annotation span."""
    if any(k.startswith(REWARD_PREFIX) for k in attributes):
        dims = under(attributes, REWARD_PREFIX)
        first = dims[0] if isinstance(dims, list) and dims else None
        if isinstance(first, dict):
            return _number(first.get("value"))
    for key in AGENTOPS_OUTPUT_KEYS:
        output = attributes.get(key)
        payload = _json(output) if isinstance(output, str) else output
        if isinstance(payload, dict) and payload.get("type") == "reward":
            return _number(payload.get("value"))
    if name == ANNOTATION_SPAN:
        return _number(attributes.get("reward"))
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


# --- chat content ------------------------------------------------------------------------------------------


def genai_messages(attributes: Attributes, key: str) -> list[Any] | None:
    """``gen_ai.input.messages`` / ``gen_ai.output.messages``: a JSON list of ``{role, parts}`` messages."""
    raw = attributes.get(key)
    parsed = _json(raw) if isinstance(raw, str) else None
    return parsed if isinstance(parsed, list) and parsed else None


def messages_of(raw: Any) -> list[Any]:
    """Message entries of raw content: a list, or a dict with numeric keys (``{"0": {...}, ...}``), or one."""
    if isinstance(raw, list):
        return raw
    if isinstance(raw, dict):
        numeric = sorted((k for k in raw if isinstance(k, str) and k.isdigit()), key=int)
        return [raw[k] for k in numeric] if numeric else [raw]
    return []


def content_text(content: Any) -> str:
    """Text of a message content: a string, or text parts (``{"type": "text", "text"|"content": ...}``)."""
    if isinstance(content, str):
        parsed = _json(content) if content.startswith("[") else None
        return content_text(parsed) if isinstance(parsed, list) else content
    if isinstance(content, list):
        texts = [p.get("text", p.get("content")) for p in content
                 if isinstance(p, dict) and p.get("type", "text") == "text"]
        return "".join(t for t in texts if isinstance(t, str))
    return ""


def messages_text(raw: Any) -> str:
    """The text of every message in order, one per line (chat messages, choices or GenAI ``parts``)."""
    out: list[str] = []
    for entry in messages_of(raw):
        if not isinstance(entry, dict):
            continue
        inner = entry.get("message")
        message: dict[str, Any] = inner if isinstance(inner, dict) else entry  # OpenAI choices wrap the message
        if "parts" in message:
            text = content_text(message["parts"])
        else:
            text = content_text(message.get("content", message.get("text")))
        if text:
            out.append(text)
    return "\n".join(out)


def image_urls(raw: Any) -> list[str]:
    """``image_url.url`` parts of the prompt messages, in order (the reference's ``extract_prompt_image_urls``)."""
    urls: list[str] = []
    for message in messages_of(raw):
        if not isinstance(message, dict) or "content" not in message:
            continue
        content = message["content"]
        if isinstance(content, str):
            content = _json(content)
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                image = part.get("image_url")
                if isinstance(image, dict) and isinstance(image.get("url"), str):
                    urls.append(image["url"])
    return urls
