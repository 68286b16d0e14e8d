"""Agent frameworks call tools through the policy endpoint unchanged: the `openai` client's tool loop, LangChain's
``ChatOpenAI.bind_tools``, LangGraph's prebuilt ReAct agent, the OpenAI Agents SDK through its Chat Completions
model, and an MCP tool server over stdio whose tool an agent lists and calls. Each runs one episode as an agent of
the runner, against the endpoint's per-attempt URL: a forced call (constrained decoding makes it valid, so the tiny
random policy gives a deterministic episode), the tool run under the SDK's ``tool_span``, then a second call for
the answer. The spans come out whole (the LLM calls with their tool attributes, the executions with the same call
ids), reach ClickHouse's tool views, and the dashboard shows them in a real browser."""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, function_tool
from agents import Runner as AgentsRunner
from agents.tool_context import ToolContext
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent
from mcp import Client, StdioServerParameters

from litstream.app.stack import Stack
from litstream.infra import clickhouse
from litstream.infra.broker import KafkaBroker, free_port
from litstream.infra.kafka import create_topics
from litstream.infra.settings import Settings
from litstream.schemas.events import SpanRecorded
from litstream.schemas.models import LLM
from litstream.trainer.checkpoint import save_checkpoint
from litstream.trainer.engines import TorchEngine
from litstream.trainer.policy import build_policy
from litstream.workers.agent import litagent
from litstream.workers.emitters import tool_span
from litstream.workers.policy_server.backends import torch_backend
from litstream.workers.runner import Runner
from tests.mcp_weather_server import CITIES, weather
from tests.policy_server_helpers import ServerThread, publish_policy, spans
from tests.waiting import until

MAX_TOKENS = 96
# The tiny policy's 256 positions hold no tool definitions: the same model with room for the tool preamble.
MAX_POSITIONS = 2048
QUESTION = "What is the weather in Oslo?"
WEATHER_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": list(CITIES)}},
                   "required": ["city"], "additionalProperties": False}}}
MCP_SERVER = Path(__file__).resolve().parent / "mcp_weather_server.py"
CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(os.environ.get("LITSTREAM_SCREENSHOTS", Path(__file__).resolve().parent.parent / ".litstream" /
                            "screenshots"))


def reward(arguments: str | dict[str, Any]) -> float:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    return 1.0 if args.get("city") in CITIES else 0.0


# -- the agents: each framework as its users write it, plus the SDK's tool_span around the tool's run ----------


def openai_agent(llm: LLM) -> float:
    client = openai.OpenAI(base_url=llm.endpoint, api_key="unused", max_retries=0, timeout=120)
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    ask = client.chat.completions.create(
        model=llm.model, messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=MAX_TOKENS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message = ask.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        assert call.type == "function"
        with tool_span(call.function.name, call.function.arguments, call_id=call.id) as t:
            result = t.result(weather(**json.loads(call.function.arguments)))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    client.chat.completions.create(model=llm.model, messages=messages, tools=[WEATHER_TOOL], tool_choice="none",
                                   temperature=0, max_tokens=MAX_TOKENS)
    return reward(message.tool_calls[0].function.arguments) if message.tool_calls else 0.0


def langchain_tool() -> Any:
    @tool("get_weather")
    def get_weather(city: Literal["Oslo", "Paris", "Rome"],
                    tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """The weather in a city."""
        with tool_span("get_weather", {"city": city}, call_id=tool_call_id) as t:
            return t.result(weather(city))

    return get_weather


def chat_model(llm: LLM) -> Any:
    return ChatOpenAI(base_url=llm.endpoint, api_key="unused", model=llm.model, temperature=0,
                      max_tokens=MAX_TOKENS, max_retries=0)


def langchain_agent(llm: LLM) -> float:
    get_weather, chat = langchain_tool(), chat_model(llm)
    ask = chat.bind_tools([get_weather], tool_choice="get_weather", strict=True).invoke([HumanMessage(QUESTION)])
    results = [get_weather.invoke(call) for call in ask.tool_calls]  # ToolMessages, the call ids injected
    chat.bind_tools([get_weather], tool_choice="none", strict=True).invoke([HumanMessage(QUESTION), ask, *results])
    return reward(ask.tool_calls[0]["args"]) if ask.tool_calls else 0.0


def langgraph_agent(llm: LLM) -> float:
    get_weather, chat = langchain_tool(), chat_model(llm)

    def model(state: Any, runtime: Any) -> Any:  # forced call first, then the answer in words
        answered = any(isinstance(m, ToolMessage) for m in state["messages"])
        return chat.bind_tools([get_weather], tool_choice="none" if answered else "get_weather", strict=True)

    graph = create_react_agent(model, [get_weather])
    final = graph.invoke({"messages": [("user", QUESTION)]}, {"recursion_limit": 6})
    calls = [c for m in final["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    return reward(calls[0]["args"]) if calls else 0.0


async def agents_sdk_agent(llm: LLM) -> float:
    @function_tool
    def get_weather(ctx: ToolContext[Any], city: Literal["Oslo", "Paris", "Rome"]) -> str:
        """The weather in a city."""
        with tool_span("get_weather", ctx.tool_arguments, call_id=ctx.tool_call_id) as t:
            return t.result(weather(city))

    async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="unused", max_retries=0, timeout=120) as client:
        agent = Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather],
                      model=OpenAIChatCompletionsModel(model=llm.model, openai_client=client),
                      model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=MAX_TOKENS))
        # After a tool ran the SDK resets tool_choice (reset_tool_choice), so the second call is "auto".
        result = await AgentsRunner.run(agent, QUESTION, max_turns=4, run_config=RunConfig(tracing_disabled=True))
    calls = [i.raw_item for i in result.new_items if i.type == "tool_call_item"]
    return reward(getattr(calls[0], "arguments", "{}")) if calls else 0.0


def strict_tool(name: str, description: str | None, schema: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool as an OpenAI tool in strict mode (as the Agents SDK's convert_schemas_to_strict makes it): its
    arguments object closed to other properties, so a forced call ends where the schema does."""
    return {"type": "function", "function": {"name": name, "description": description or "", "strict": True,
                                             "parameters": {**schema, "additionalProperties": False}}}


async def mcp_agent(llm: LLM) -> float:
    async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="unused", max_retries=0, timeout=120) as client, \
            Client(StdioServerParameters(command=sys.executable, args=[str(MCP_SERVER)])) as session:
        tools = [strict_tool(t.name, t.description, t.input_schema) for t in (await session.list_tools()).tools]
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        ask = await client.chat.completions.create(model=llm.model, messages=messages, tools=tools,
                                                   tool_choice="required", temperature=0, max_tokens=MAX_TOKENS)
        message = ask.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            assert call.type == "function"
            with tool_span(call.function.name, call.function.arguments, call_id=call.id) as t:
                out = await session.call_tool(call.function.name, json.loads(call.function.arguments))
                text = t.result("".join(getattr(c, "text", "") for c in out.content))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
        await client.chat.completions.create(model=llm.model, messages=messages, tools=tools, tool_choice="none",
                                             temperature=0, max_tokens=MAX_TOKENS)
    return reward(message.tool_calls[0].function.arguments) if message.tool_calls else 0.0


FRAMEWORKS: dict[str, Callable[[LLM], Any]] = {
    "openai": openai_agent, "langchain": langchain_agent, "langgraph": langgraph_agent,
    "agents_sdk": agents_sdk_agent, "mcp": mcp_agent}


@litagent
def frameworks_agent(task: dict[str, str], llm: LLM) -> Any:
    """The runner's one agent: the task names the framework."""
    return FRAMEWORKS[task["framework"]](llm)


# -- the stack: lifecycle, span sink, gateway; the endpoint (published as the attempts' LLM) and a runner ------


@dataclass(frozen=True)
class World:
    settings: Settings
    base: str  # the gateway


def call(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def world(broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("tools")
    settings = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=2,
                        data_dir=tmp / "data", clickhouse_dsn=f"chdb://{tmp / 'chdb'}")
    create_topics(settings)
    policy = build_policy("tiny", seed=0, max_positions=MAX_POSITIONS)
    checkpoint = save_checkpoint(tmp / "checkpoints", policy.model, policy.tokenizer, 0, keep_last=None)
    port = free_port()
    with Stack(settings) as stack:
        for role in ("lifecycle", "span-sink"):
            stack.start(role, "process", role)
        stack.start("gateway", "gateway", "--port", str(port))
        for role in ("lifecycle", "span-sink", "gateway"):
            stack.wait_ready(role, role, timeout=180)
        backend = torch_backend(TorchEngine.from_checkpoint(checkpoint), "tiny-policy")
        with ServerThread(settings, backend, publish=True) as server:
            publish_policy(settings, 0, checkpoint)
            follower = server.running.follower
            assert follower is not None
            until("the endpoint published itself", lambda: follower.published)
            runner = Runner(settings, frameworks_agent, concurrency=2)
            running = threading.Thread(target=runner.run, daemon=True)
            running.start()
            try:
                yield World(settings, f"http://127.0.0.1:{port}")
            finally:
                runner.stop_event.set()
                running.join(60)


def run_episode(world: World, framework: str) -> tuple[str, list[SpanRecorded]]:
    """Enqueue one rollout for ``framework``, wait for it to succeed; its spans once all are on the topic."""
    status, body = call(f"{world.base}/v1/rollouts", "POST",
                        {"input": {"framework": framework}, "resources_id": "policy-v0"})
    assert status == 201, body
    rid = str(body["rollout_id"])

    def finished() -> dict[str, Any] | None:
        items = call(f"{world.base}/v1/rollouts")[1]["items"]
        item = next((i for i in items if i["rollout_id"] == rid), None)
        return item if item and item["status"] in ("succeeded", "failed", "cancelled") else None

    item = until(f"the {framework} rollout finished", finished, timeout=240)
    assert item["status"] == "succeeded", [a.get("error") for a in item.get("attempts", [])]

    def whole() -> list[SpanRecorded] | None:
        found = [s for s in spans(world.settings) if s.rollout_id == rid]
        names = [s.name for s in found]
        done = sum(n.startswith("chat ") for n in names) >= 2 and "agentlightning.annotation" in names
        return found if done and any(n.startswith("execute_tool ") for n in names) else None

    return rid, until(f"the {framework} episode's spans", whole)


def history(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """The prompt's messages as the endpoint recorded them (role, content, tool_calls, tool_call_id)."""
    out, n = [], 0
    while f"gen_ai.prompt.{n}.role" in attrs:
        out.append({key: attrs[f"gen_ai.prompt.{n}.{key}"] for key in ("role", "content", "tool_calls", "tool_call_id")
                    if f"gen_ai.prompt.{n}.{key}" in attrs})
        n += 1
    return out


def assert_whole(found: list[SpanRecorded], first_choice: str, second_choice: str) -> list[dict[str, Any]]:
    """The episode's spans: the forced call with its tool attributes, each call run under the same id, the
    answer's prompt holding the calls and their results; returns the calls."""
    llm = sorted((s for s in found if s.name.startswith("chat ")), key=lambda s: s.start_time_ns)
    assert len(llm) == 2, [s.name for s in found]
    ask, answer = (s.attributes for s in llm)
    assert {(s.rollout_id, s.attempt_id) for s in found} == {(llm[0].rollout_id, llm[0].attempt_id)}
    assert [t["function"]["name"] for t in json.loads(str(ask["gen_ai.tool.definitions"]))] == ["get_weather"]
    assert (ask["gen_ai.request.tool_choice"], answer["gen_ai.request.tool_choice"]) == (first_choice, second_choice)
    calls = json.loads(str(ask["gen_ai.completion.0.tool_calls"]))
    assert calls and ask["gen_ai.completion.0.finish_reason"] == "tool_calls"
    assert ask["litstream.tool_calls.count"] == len(calls) and ask["litstream.constrained"] is True
    [said] = json.loads(str(ask["gen_ai.output.messages"]))
    assert [p["id"] for p in said["parts"] if p["type"] == "tool_call"] == [c["id"] for c in calls]
    runs = {str(s.attributes["gen_ai.tool.call.id"]): s for s in found if s.name.startswith("execute_tool ")}
    assert set(runs) == {c["id"] for c in calls}
    for c in calls:
        args, run = json.loads(c["arguments"]), runs[c["id"]]
        assert c["name"] == "get_weather" and args["city"] in CITIES
        assert run.name == "execute_tool get_weather" and run.status_code == "OK"
        assert json.loads(str(run.attributes["gen_ai.tool.call.arguments"])) == args
        assert run.attributes["gen_ai.tool.call.result"] == weather(args["city"])
    past = history(answer)
    assert [[c["id"] for c in json.loads(m["tool_calls"])] for m in past if "tool_calls" in m] == [
        [c["id"] for c in calls]]
    assert {m["tool_call_id"]: m["content"] for m in past if m["role"] == "tool"} == {
        c["id"]: weather(json.loads(c["arguments"])["city"]) for c in calls}
    assert "gen_ai.completion.0.tool_calls" not in answer and answer["litstream.tool_calls.count"] == 0
    return calls


# -- the frameworks -----------------------------------------------------------------------------------------


def test_the_openai_client_tool_loop(world: World) -> None:
    _, found = run_episode(world, "openai")
    assert len(assert_whole(found, "get_weather", "none")) == 1


def test_langchain_bind_tools(world: World) -> None:
    _, found = run_episode(world, "langchain")
    assert len(assert_whole(found, "get_weather", "none")) == 1


# LangGraph 1.x points to langchain.agents.create_agent (the `langchain` package); the prebuilt agent still ships.
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_langgraph_prebuilt_react_agent(world: World) -> None:
    _, found = run_episode(world, "langgraph")
    assert len(assert_whole(found, "get_weather", "none")) == 1


def test_openai_agents_sdk_chat_completions_model(world: World) -> None:
    _, found = run_episode(world, "agents_sdk")
    assert len(assert_whole(found, "get_weather", "auto")) == 1


def test_an_mcp_tool_server_listed_and_called(world: World) -> None:
    _, found = run_episode(world, "mcp")
    assert_whole(found, "required", "none")


# -- ClickHouse and the dashboard ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser_page() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if os.environ.get("LITSTREAM_REQUIRE_BROWSER") or os.environ.get("CI"):
            pytest.fail("no /usr/bin/chromium: CI must install Debian's chromium (apt-get install chromium)")
        pytest.skip("no /usr/bin/chromium: apt-get install chromium to run the browser tests")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield browser.new_page(viewport={"width": 1400, "height": 900})
        browser.close()


def test_an_episode_in_the_tool_views_and_on_the_rollout_page(world: World, browser_page: Any) -> None:
    rid, found = run_episode(world, "openai")
    [c] = assert_whole(found, "get_weather", "none")
    dsn = world.settings.resolved_clickhouse_dsn

    def used() -> list[list[Any]] | None:
        rows = clickhouse.query(dsn, "SELECT reward, llm_calls, tool_calls, tool_executions, tool_errors, malformed, "
                                     f"invalid_arguments, tools, used_tool FROM attempt_tool_use "
                                     f"WHERE rollout_id = '{rid}'").rows
        return rows if rows and rows[0][2] + rows[0][3] == 2 else None

    assert until("the episode in attempt_tool_use", used) == [[1.0, 2, 1, 1, 0, 0, 0, ["get_weather"], 1]]
    calls = clickhouse.query(dsn, "SELECT source, tool_name, call_id, arguments_json, constrained, result "
                                  f"FROM tool_calls WHERE rollout_id = '{rid}' ORDER BY source").rows
    city = json.loads(c["arguments"])["city"]
    assert calls == [["execution", "get_weather", c["id"], 1, 0, weather(city)],
                     ["llm", "get_weather", c["id"], 1, 1, ""]]

    page = browser_page
    page.goto(f"{world.base}/ui/rollouts/{rid}")
    tool_row = page.locator(".wf-row:has(.kind.k-tool)")
    tool_row.wait_for(timeout=60_000)
    assert "execute_tool get_weather" in tool_row.inner_text() and weather(city) in tool_row.inner_text()
    assert "get_weather(" in page.locator(".wf-row:has(.kind.k-llm)").first.inner_text()  # the call it answered
    shown = page.locator(f'.llm .tool-call[data-call="{c["id"]}"]')
    assert shown.count() >= 2  # in the answer of the first call, and in the history of the second
    assert weather(city) in shown.first.locator(".tool-result").inner_text()
    assert page.locator(".msg.role-tool").first.is_visible() and "choice" in page.locator(".llm-head").first.inner_text()
    tool_row.locator("summary").click()
    assert tool_row.locator("text=gen_ai.tool.call.result").is_visible()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "rollout-tools.png"), full_page=True)
