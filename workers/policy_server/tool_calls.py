"""Tool calling on the policy endpoint: the forms a model writes calls in, the prompt a call is rendered into, the
request's tools checked, and the model's text parsed back into OpenAI ``tool_calls``.

A model writes its calls in the form of its family, which its chat template shows (``template_tools``):

* ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block a call (Qwen2.5,
  Qwen3, SmolLM3, Hermes models: their templates render calls that way);
* ``llama3_json``: ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>`` (Llama 3.1-3.3);
* ``generic``: the framing of ``hermes``, for the models whose own template takes no tools (SmolLM2, the tiny
  policy's plain template). The generic template (:func:`generic_turns`) writes a system preamble listing the
  tools as JSON and saying how to call them, each earlier call the way the constrained grammar makes the model
  write it, and each tool result as a ``tool`` turn in ``<tool_response>`` tags.

A template that takes tools in another form is not used for tools: the generic template is.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaValidationError
from jsonschema.validators import validator_for

from litstream.trainer.constrained import ToolCallGrammar

from .openai_api import ApiError, ChatCompletionRequest, ChatMessage

CHOICES = ("none", "auto", "required")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
GENERIC_PREAMBLE = (
    "You can call functions. Their definitions, one JSON object a line:\n<tools>\n{tools}\n</tools>\n"
    "To call a function, write a JSON object with its name and arguments between <tool_call> tags:\n"
    '<tool_call>\n{{"name": <function name>, "arguments": <arguments object>}}\n</tool_call>\n'
    "Results come back in a tool turn, between <tool_response> tags."
)
RESPONSE_BEGIN, RESPONSE_END = "<tool_response>\n", "\n</tool_response>"
PYTHON_TAG = "<|python_tag|>"


# --- calls ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One call: OpenAI's id, the function's name, its arguments as a JSON string."""

    id: str
    name: str
    arguments: str

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def flat(self) -> dict[str, Any]:
        """The span's shape: ``{"id", "type", "name", "arguments"}``."""
        return {"id": self.id, "type": "function", "name": self.name, "arguments": self.arguments}

    def arguments_object(self) -> Any:
        try:
            return json.loads(self.arguments)
        except json.JSONDecodeError:
            return self.arguments


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def dumps(value: Any) -> str:
    """JSON as the constrained grammar writes it: ``json.dumps``'s separators, characters as they are."""
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Turn:
    """A message of the conversation as the templates see it."""

    role: str
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


# --- the forms -----------------------------------------------------------------------------------------------


@dataclass
class Parsed:
    """What a generation said: the text outside its calls (None when there is none), the calls, how many call
    openings did not parse (left in the content), and where each kept call lies in the text."""

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)
    malformed: int = 0
    spans: list[tuple[int, int]] = field(default_factory=list)

    def keep_first(self) -> Parsed:
        return Parsed(self.content, self.calls[:1], self.malformed, self.spans[:1])


@dataclass(frozen=True)
class CallForm:
    """How a model family writes its calls: the text around each call's JSON body and its arguments' key."""

    name: str
    begin: str
    end: str
    arguments_key: str = "arguments"
    parallel: bool = True  # the family writes several calls in one answer
    separator: str = "\n"

    def write(self, calls: Sequence[ToolCall]) -> str:
        """The calls as the grammar makes the model write them (so a rendered turn is what was sampled)."""
        bodies = [dumps({"name": c.name, self.arguments_key: c.arguments_object()}) for c in calls]
        return self.separator.join(f"{self.begin}{b}{self.end}" for b in bodies)

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> ToolCallGrammar:
        return ToolCallGrammar(tools=tuple((t.name, json.dumps(t.parameters)) for t in tools), begin=self.begin,
                               end=self.end, arguments_key=self.arguments_key, parallel=parallel and self.parallel)

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> Parsed:
        if self.begin.strip():
            return _parse_tagged(text, self.begin.strip(), self.end.strip(), tools)
        return _parse_bare(text, tools)


HERMES = CallForm("hermes", "<tool_call>\n", "\n</tool_call>")
GENERIC = CallForm("generic", "<tool_call>\n", "\n</tool_call>")
LLAMA3_JSON = CallForm("llama3_json", "", "", arguments_key="parameters", parallel=False)
FORMS = {f.name: f for f in (HERMES, GENERIC, LLAMA3_JSON)}


@dataclass(frozen=True)
class ToolTemplate:
    """How a model's calls are rendered and parsed: ``native`` when its own chat template renders the tools."""

    form: CallForm
    native: bool


def template_tools(chat_template: str | None) -> ToolTemplate:
    """The form a model family writes calls in, told by its chat template's source."""
    if not chat_template or not re.search(r"\btools\b", chat_template):
        return ToolTemplate(GENERIC, native=False)
    if "<tool_call>" in chat_template:
        return ToolTemplate(HERMES, native=True)
    if PYTHON_TAG in chat_template or ('"parameters"' in chat_template and "<|start_header_id|>" in chat_template):
        return ToolTemplate(LLAMA3_JSON, native=True)
    return ToolTemplate(GENERIC, native=False)  # a form no parser here reads: the generic template instead


def _call_of(body: Any, tools: Sequence[ToolSpec]) -> ToolCall | None:
    """A parsed call body as a call of one of ``tools``, or None when it is not one."""
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return None
    tool = next((t for t in tools if t.name == body["name"]), None)
    args = body.get("arguments", body.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if tool is None or not isinstance(args, dict) or not tool.accepts(args):
        return None
    return ToolCall(new_call_id(), tool.name, dumps(args))


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _parse_tagged(text: str, begin: str, end: str, tools: Sequence[ToolSpec]) -> Parsed:
    """Calls in ``begin`` ... ``end`` blocks; an opened block that does not hold a call stays in the content."""
    pattern = re.compile(re.escape(begin) + r"(.*?)(" + re.escape(end) + r"|\Z)", re.DOTALL)
    parsed = Parsed(content=None)
    outside, at = [], 0
    for m in pattern.finditer(text):
        call = _call_of(_loads(m.group(1).strip()), tools) if m.group(2) else None
        if call is None:
            parsed.malformed += 1
            continue
        outside.append(text[at: m.start()])
        at = m.end()
        parsed.calls.append(call)
        parsed.spans.append((m.start(), m.end()))
    outside.append(text[at:])
    parsed.content = ("".join(outside).strip() or None) if parsed.calls else (text or None)
    return parsed


def _parse_bare(text: str, tools: Sequence[ToolSpec]) -> Parsed:
    """Llama 3's JSON form: the whole answer is one call (or several separated by ``;``), optionally after
    ``<|python_tag|>``; anything else is content."""
    body = text.strip()
    start = text.find(body) if body else 0
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].lstrip()
    elif not body.startswith("{"):
        return Parsed(content=text or None)
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            obj, at = decoder.raw_decode(body, at)
        except json.JSONDecodeError:
            return Parsed(content=text or None, malformed=1)
        call = _call_of(obj, tools)
        if call is None:
            return Parsed(content=text or None, malformed=1)
        calls.append(call)
        while at < len(body) and body[at] in "; \n\t":
            at += 1
    if not calls:
        return Parsed(content=text or None, malformed=1)
    return Parsed(content=None, calls=calls, spans=[(start, len(text))] * len(calls))


# --- the request's tools -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str | None
    parameters: dict[str, Any]
    strict: bool = False

    def definition(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}

    def accepts(self, arguments: dict[str, Any]) -> bool:
        """Arguments of a call under ``auto``: any object, or one valid against the schema for a strict tool."""
        if not self.strict:
            return True
        try:
            validator_for(self.parameters, default=Draft202012Validator)(self.parameters).validate(arguments)
        except SchemaValidationError:
            return False
        return True


@dataclass(frozen=True)
class ToolPlan:
    """The request's tools, what it asks of them, and the conversation as turns."""

    tools: tuple[ToolSpec, ...]
    choice: str  # "none" | "auto" | "required" | a function's name
    parallel: bool
    turns: tuple[Turn, ...]

    @property
    def used(self) -> bool:
        """Tools offered or calls in the history: the tool-aware prompt, and the span's tool attributes."""
        return bool(self.tools) or any(t.tool_calls or t.tool_call_id for t in self.turns)

    @property
    def forced(self) -> bool:
        return self.choice not in ("none", "auto")

    def definitions(self) -> list[dict[str, Any]]:
        return [t.definition() for t in self.tools]

    def grammar(self, form: CallForm) -> ToolCallGrammar | None:
        """The grammar a forced call is decoded under: the named function alone, or any of the tools."""
        if not self.forced:
            return None
        if self.choice == "required":
            return form.grammar(self.tools, self.parallel)
        return form.grammar([t for t in self.tools if t.name == self.choice], parallel=False)

    def parse(self, text: str, form: CallForm) -> Parsed | None:
        """The calls in a generation's text (None under ``none``: the text is the content)."""
        if self.choice == "none" or not self.tools:
            return None
        parsed = form.parse(text, self.tools)
        return parsed if self.parallel else parsed.keep_first()


def plan_tools(req: ChatCompletionRequest) -> ToolPlan:
    """The request's tools checked together (each definition was checked alone by the request's model)."""
    tools = tuple(_spec(t.function) for t in req.tools or [])
    names = [t.name for t in tools]
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise _bad(f"two tools are named {dup!r}: each function needs its own name", "tools")
    choice = _choice(req, names)
    if req.parallel_tool_calls is not None and not tools:
        raise _bad("parallel_tool_calls is only allowed when tools are given", "parallel_tool_calls")
    for legacy in ("functions", "function_call"):
        if (req.model_extra or {}).get(legacy) is not None:
            raise _bad(f"{legacy} (OpenAI's deprecated form) is not supported: send tools and tool_choice", legacy)
    parallel = req.parallel_tool_calls is not False
    return ToolPlan(tools, choice, parallel, tuple(_turns(req.messages)))


def _spec(function: Any) -> ToolSpec:
    return ToolSpec(function.name, function.description, function.parameters or dict(EMPTY_PARAMETERS),
                    bool(function.strict))


def _choice(req: ChatCompletionRequest, names: list[str]) -> str:
    given = req.tool_choice
    if given is None:
        return "auto" if names else "none"
    choice = given if isinstance(given, str) else given.function.name
    if choice != "none" and not names:
        raise _bad(f"tool_choice {choice!r} needs tools: the request gives none", "tool_choice")
    if choice not in CHOICES and choice not in names:
        raise _bad(f"tool_choice names function {choice!r}, which is not among the tools ({', '.join(names)})",
                   "tool_choice")
    return choice


def _turns(messages: Sequence[ChatMessage]) -> list[Turn]:
    turns: list[Turn] = []
    call_ids: set[str] = set()
    for i, m in enumerate(messages):
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments if isinstance(c.function.arguments, str)
                               else dumps(c.function.arguments)) for c in m.tool_calls or [])
        if calls and m.role != "assistant":
            raise _bad(f"messages[{i}] is a {m.role} message with tool_calls: only assistant messages carry them",
                       f"messages.{i}.tool_calls")
        for j, c in enumerate(calls):
            if not isinstance(c.arguments_object(), dict):
                raise _bad(f"messages[{i}].tool_calls[{j}].function.arguments is not a JSON object: {c.arguments!r}",
                           f"messages.{i}.tool_calls.{j}.function.arguments")
        call_ids.update(c.id for c in calls)
        if m.role == "tool" and m.tool_call_id not in call_ids:
            raise _bad(f"messages[{i}] is a tool message whose tool_call_id {m.tool_call_id!r} answers no call of "
                       "an earlier assistant message", f"messages.{i}.tool_call_id")
        turns.append(Turn(str(m.role), m.text(), calls, m.tool_call_id, m.name))
    return turns


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


# --- rendering -----------------------------------------------------------------------------------------------


def generic_turns(turns: Sequence[Turn], definitions: Sequence[dict[str, Any]],
                  form: CallForm = GENERIC) -> list[tuple[str, str]]:
    """The generic template: (role, text) turns for a template that knows no tools. The tools go into a system
    preamble (after the first system message's own text, or as a system message of their own); an assistant
    turn's calls follow its text as the model writes them; a tool result is a ``tool`` turn in
    ``<tool_response>`` tags."""
    out: list[tuple[str, str]] = []
    for t in turns:
        if t.tool_calls:
            out.append((t.role, (t.text + "\n" if t.text else "") + form.write(t.tool_calls)))
        elif t.role in ("tool", "function"):
            out.append(("tool", RESPONSE_BEGIN + t.text + RESPONSE_END))
        else:
            out.append((t.role, t.text))
    if definitions:
        preamble = GENERIC_PREAMBLE.format(tools="\n".join(dumps(d) for d in definitions))
        if out and out[0][0] in ("system", "developer"):
            out[0] = (out[0][0], f"{out[0][1]}\n\n{preamble}" if out[0][1] else preamble)
        else:
            out.insert(0, ("system", preamble))
    return out


def native_messages(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """The turns as Transformers' chat templates take them (a call's arguments as an object)."""
    out = []
    for t in turns:
        m: dict[str, Any] = {"role": {"developer": "system", "function": "tool"}.get(t.role, t.role),
                             "content": t.text}
        if t.tool_calls:
            m["tool_calls"] = [{"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments_object()}}
                               for c in t.tool_calls]
        if t.tool_call_id is not None:
            m["tool_call_id"] = t.tool_call_id
        if t.name is not None:
            m["name"] = t.name
        out.append(m)
    return out


# --- the answer ----------------------------------------------------------------------------------------------


@dataclass
class ToolAnswer:
    """A call's tools and what each of its generations said (None per generation: not parsed, under ``none``)."""

    plan: ToolPlan
    parsed: list[Parsed | None]
    constrained: bool
    grammar: ToolCallGrammar | None = None  # what a constrained call was decoded under

    def of(self, index: int) -> Parsed | None:
        return self.parsed[index] if index < len(self.parsed) else None

    def calls(self, index: int) -> list[ToolCall]:
        parsed = self.of(index)
        return parsed.calls if parsed is not None else []

    @property
    def malformed(self) -> int:
        return sum(p.malformed for p in self.parsed if p is not None)


def answer_tools(plan: ToolPlan, form: CallForm, texts: Sequence[str], constrained: bool,
                 grammar: ToolCallGrammar | None = None) -> ToolAnswer:
    return ToolAnswer(plan, [plan.parse(t, form) for t in texts], constrained, grammar)
