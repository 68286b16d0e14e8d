"""A bounded wait for tests: poll until a condition holds (the deadline only ends a hung test; it is not a timed
assertion)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(what: str, check: Callable[[], Any], timeout: float = 120.0, every: float = 0.2) -> Any:
    """The first truthy value of ``check()``; AssertionError naming ``what`` if none comes in ``timeout``."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not reached in {timeout:.0f}s: {what} (last: {value!r})")
