"""How a trained policy version is named on the resources topic.

The trainer publishes policy version N as resources id ``policy-vN`` holding one LLM resource (``main_llm``).
Spans record the resources id their attempt ran with, so any span or triplet names the policy version that
produced it without a lookup.
"""

from __future__ import annotations

import re

POLICY_RESOURCE = "main_llm"
_PATTERN = re.compile(r"^policy-v(\d+)$")


def policy_resources_id(version: int) -> str:
    if version < 0:
        raise ValueError("policy versions start at 0")
    return f"policy-v{version}"


def parse_policy_version(resources_id: str | None) -> int | None:
    """The policy version a resources id names, or None when it is not a policy publication."""
    if not resources_id:
        return None
    m = _PATTERN.match(resources_id)
    return int(m.group(1)) if m else None

def resources_order(resources_id: str | None) -> tuple[int, int, str]:
    """A sort key: policy versions by number, then other resources ids by name, then none (spans without one)."""
    n = parse_policy_version(resources_id)
    if n is not None:
        return (0, n, "")
    return (1, 0, resources_id) if resources_id else (2, 0, "")


def version_label(resources_id: str | None) -> str:
    """``v3`` for policy version 3; any other resources id as it is."""
    n = parse_policy_version(resources_id)
    return f"v{n}" if n is not None else (resources_id or "(none)")


def label_order(label: str) -> tuple[int, int, str]:
    """:func:`resources_order` of a :func:`version_label`."""
    return resources_order(f"policy-{label}" if label.startswith("v") and label[1:].isdigit() else label)


# The rollout and attempt id of spans recorded outside any attempt (e.g. a call to the policy server's plain
# ``/v1/...``): stored like any span, never turned into triplets, never attributed to a rollout.
UNATTRIBUTED = "unattributed"
