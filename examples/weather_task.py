"""The weather task, pure: its cities and units, the tool the agent offers and what it answers, the reward.

The agent (``examples/weather_agent.py``) runs it with the ``openai`` client; the trainer's device check
(``bench/trainer_device.py``) builds its prompts from here without the agent's client and emitters."""

from __future__ import annotations

import json
import random
import re
from typing import Any

SYSTEM = ("You are a weather assistant. You do not know any temperature yourself: call get_temperature to look "
          "it up, then answer with the number.")
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "get_temperature", "description": "The temperature in a city right now, in the unit asked for.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}]
UNITS = ("celsius", "fahrenheit")
CITIES = ("Paris", "Oslo", "Lima", "Cairo", "Tokyo", "Rome", "Quito", "Perth", "Dublin", "Madrid", "Berlin",
          "Vienna", "Prague", "Lisbon", "Athens", "Warsaw", "Moscow", "Delhi", "Seoul", "Manila", "Nairobi", "Accra",
          "Dakar", "Tunis", "Havana", "Bogota", "Santiago", "Denver", "Boston", "Chicago", "Toronto", "Sydney")


def make_dataset(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` tasks ``{"city", "unit", "temperature"}``: a city, the unit asked for, and the number (Celsius) only
    its tool will tell."""
    rng = random.Random(seed)
    return [{"city": rng.choice(CITIES), "unit": rng.choice(UNITS), "temperature": rng.randint(-9, 39)}
            for _ in range(n)]


def question(task: dict[str, Any]) -> str:
    return f"What is the temperature in {task['city']} now, in degrees {unit_of(task).capitalize()}?"


def unit_of(task: dict[str, Any]) -> str:
    return str(task.get("unit", "celsius"))  # tasks written before the unit are in Celsius


def reading(task: dict[str, Any], unit: str) -> int:
    """The task's temperature in ``unit``, as the tool says it (a whole number)."""
    celsius = int(task["temperature"])
    return celsius if unit == "celsius" else round(celsius * 9 / 5 + 32)


def run_tool(task: dict[str, Any], name: str, arguments: str) -> str:
    """What the tool answers: the task's temperature for its city in the unit named, an error otherwise (as a
    real tool would)."""
    if name != "get_temperature":
        return f"error: there is no tool named {name!r}"
    try:
        args = json.loads(arguments)
        city, unit = args.get("city"), args.get("unit", "celsius")
    except (json.JSONDecodeError, AttributeError):
        return "error: the arguments are not a JSON object"
    if not isinstance(city, str) or city.strip().lower() != task["city"].lower():
        return f"error: no weather station for {city!r}"
    if unit not in UNITS:
        return f"error: unit must be one of {', '.join(UNITS)}, not {unit!r}"
    return f"{reading(task, unit)} {unit[0].upper()}"


def called_right(task: dict[str, Any], arguments: str) -> bool:
    """The call named the task's city and the unit the question asked for."""
    try:
        args = json.loads(arguments)
        return (str(args.get("city", "")).strip().lower() == task["city"].lower()
                and args.get("unit", "celsius") == unit_of(task))
    except (json.JSONDecodeError, AttributeError):
        return False


def reward(task: dict[str, Any], answer: str) -> float:
    """1.0 when the answer holds the tool's number in the unit asked for (as a whole number), else 0.0."""
    return 1.0 if str(reading(task, unit_of(task))) in re.findall(r"-?\d+", answer) else 0.0
