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
from pathlib import Path
from typing import Any

import openai

from examples.arithmetic_agent import DATA_DIR, write_jsonl
from examples.weather_task import (  # noqa: F401  (the task's names, as the agent's module has always had them)
    CITIES,
    SYSTEM,
    TOOLS,
    UNITS,
    called_right,
    make_dataset,
    question,
    reading,
    reward,
    run_tool,
    unit_of,
)
from litstream.workers.emitters import emit_reward, tool_span

MAX_TURNS = 3
MAX_TOKENS = 48  # a call or a short answer


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
