"""The closed loop's toy task: repeat a letter N times, e.g. prompt ``"cx3="`` -> ``"ccc"`` then stop.

The reward is verifiable and gives partial credit, so GRPO has a signal even from a random byte-level policy:
each position of the target earns 1 for the right letter and ``class_credit`` for another letter of the task's
alphabet, and the total is divided by the longer of response and target, so running on past N costs. A random
policy over 259 byte ids scores about 0.01; the tiny model first learns to answer in the alphabet (reward
~0.2 after 15-20 steps of 8 groups x 4), then to copy the letter and stop, which takes longer.
"""

from __future__ import annotations

import random
from typing import Any

LETTERS = "abcd"
MAX_COUNT = 2
MAX_NEW_TOKENS = 3  # room to overshoot the longest answer, so stopping is part of the task


def make_task(rng: random.Random) -> dict[str, Any]:
    return {"letter": rng.choice(LETTERS), "count": rng.randint(1, MAX_COUNT)}


def render_prompt(task: dict[str, Any]) -> str:
    return f"{task['letter']}x{task['count']}="


def target(task: dict[str, Any]) -> str:
    return str(task["letter"]) * int(task["count"])


def reward(task: dict[str, Any], response_text: str, class_credit: float = 0.25) -> float:
    """In [0, 1]: 1 exactly for the target; see the module doc for the partial credit."""
    want = target(task)
    got = response_text
    credit = 0.0
    for w, g in zip(want, got):
        if g == w:
            credit += 1.0
        elif g in LETTERS:
            credit += class_credit
    return credit / max(len(want), len(got), 1)
