"""A tool-using agent, written with the ``openai`` client: the answer comes only from its tool.

Each task names a city and holds that city's temperature, which only the agent's tool knows (a number drawn
at random for each task, so no model can know it). The agent offers ``get_temperature(city)``. Its first call
requires a tool call (``tool_choice="required"``, as agents do when a task cannot be done without one: an
untrained SmolLM2-135M never calls a tool on its own, docs/training.md), one at a time
(``parallel_tool_calls=False``); the model still chooses the arguments.
The agent runs each call, sends the result back and asks again (``auto``: answer or call again), for at most
``MAX_TURNS`` calls. Its reward has two dimensions: ``answer`` (the primary, what GRPO trains on) is 1.0 when
the final answer holds the tool's number, and ``tool_call`` is 1.0 when a call reached the city's weather
station; validation reports both.

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
    "name": "get_temperature", "description": "The temperature in a city right now, in degrees Celsius.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}]
CITIES = ("Paris", "Oslo", "Lima", "Cairo", "Tokyo", "Rome", "Quito", "Perth", "Dublin", "Madrid", "Berlin",
          "Vienna", "Prague", "Lisbon", "Athens", "Warsaw", "Moscow", "Delhi", "Seoul", "Manila", "Nairobi", "Accra",
          "Dakar", "Tunis", "Havana", "Bogota", "Santiago", "Denver", "Boston", "Chicago", "Toronto", "Sydney")


def make_dataset(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` tasks ``{"city", "temperature"}``: a city and the number only its tool will tell."""
    rng = random.Random(seed)
    return [{"city": rng.choice(CITIES), "temperature": rng.randint(-9, 39)} for _ in range(n)]


def run_tool(task: dict[str, Any], name: str, arguments: str) -> str:
    """What the tool answers: the task's temperature for its city, an error otherwise (as a real tool would)."""
    if name != "get_temperature":
        return f"error: there is no tool named {name!r}"
    try:
        city = json.loads(arguments).get("city")
    except (json.JSONDecodeError, AttributeError):
        return "error: the arguments are not a JSON object"
    if not isinstance(city, str) or city.strip().lower() != task["city"].lower():
        return f"error: no weather station for {city!r}"
    return f"{task['temperature']} C"


def reward(task: dict[str, Any], answer: str) -> float:
    """1.0 when the answer holds the tool's number (as a whole number), else 0.0."""
    return 1.0 if str(task["temperature"]) in re.findall(r"-?\d+", answer) else 0.0


def weather_agent(task: dict[str, Any], llm: Any) -> None:
    """The tool loop: ask (a call required the first time), run the calls the model makes, send their results,
    ask again; then the reward's two dimensions."""
    client = openai.OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=2)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": f"What is the temperature in {task['city']} now?"}]
    answer, reached = "", False
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
            reached = reached or not result.startswith("error")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    emit_reward({"answer": reward(task, answer), "tool_call": float(reached)}, primary_key="answer")


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
