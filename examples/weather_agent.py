"""A tool-using agent, written with the ``openai`` client: the answer comes only from its tool.

Each task names a city and a unit (Celsius or Fahrenheit) and holds that city's temperature, which only the
agent's tool knows (a number drawn at random for each task, so no model can know it). The agent offers
``get_temperature(city, unit)``, the unit one of ``celsius`` and ``fahrenheit``. Its first call requires a tool call
(``tool_choice="required"``, as agents do when a task cannot be done without one: an untrained SmolLM2-135M never
calls a tool on its own, docs/training.md), one at a time (``parallel_tool_calls=False``); the model still chooses
the arguments, and must read both from the question. The agent runs each call, sends the result back and asks
again (``auto``: answer or call again), for at most ``MAX_TURNS`` calls. Its reward has two dimensions: ``answer``
(the primary, what GRPO trains on) is 1.0 when the final answer holds the tool's number in the unit asked for, and
``tool_call`` is 1.0 when a call named the task's city and unit; validation reports both.

    python -m examples.weather_agent data          # examples/data/weather_{train,val}.jsonl
    litstream train --agent examples.weather_agent:weather_agent --model smollm2 \\
                    --train examples/data/weather_train.jsonl --val examples/data/weather_val.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path
from typing import Any

import openai

from examples.arithmetic_agent import DATA_DIR, write_jsonl
from litstream.workers.emitters import emit_reward, tool_span

MAX_TURNS = 3
MAX_TOKENS = 48  # a call or a short answer
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


def weather_agent(task: dict[str, Any], llm: Any) -> None:
    """The tool loop: ask (a call required the first time), run the calls the model makes, send their results,
    ask again; then the reward's two dimensions."""
    client = openai.OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=2)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": question(task)}]
    answer, right = "", False
    for turn in range(MAX_TURNS):
        reply = client.chat.completions.create(model=llm.model, messages=messages,  # type: ignore[arg-type]
                                               tools=TOOLS, tool_choice="required" if turn == 0 else "auto",  # type: ignore[arg-type]
                                               parallel_tool_calls=False, max_tokens=MAX_TOKENS)
        message = reply.choices[0].message
        if not message.tool_calls:
            answer = message.content or ""
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            with tool_span(call.function.name, call.function.arguments, call_id=call.id) as span:
                result = span.result(run_tool(task, call.function.name, call.function.arguments))
            right = right or (call.function.name == "get_temperature"
                              and called_right(task, call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    emit_reward({"answer": reward(task, answer), "tool_call": float(right)}, primary_key="answer")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="write the train and validation JSONL files")
    data.add_argument("--train", type=int, default=160)
    data.add_argument("--val", type=int, default=64)
    data.add_argument("--out", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "weather_train.jsonl", make_dataset(args.train, 0))
    write_jsonl(args.out / "weather_val.jsonl", make_dataset(args.val, 1))
    print(f"wrote {args.train} + {args.val} tasks to {args.out}")


if __name__ == "__main__":
    main()
