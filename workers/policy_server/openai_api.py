"""The OpenAI request and response bodies the server speaks (the subset that matters for a policy endpoint).

Requests are validated; fields this server does not know are accepted and ignored, as OpenAI's own server does
for forward compatibility. Errors use OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from functools import lru_cache
from typing import Any, Literal

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.validators import validator_for
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # what OpenAI's API accepts as a function's name


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: str
    text: str | None = None


class FunctionCall(_Open):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any]  # a JSON string, as OpenAI sends it (an object is taken too)


class MessageToolCall(_Open):
    """A call an earlier assistant message made."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant message's calls
    tool_call_id: str | None = None  # the call a tool message answers

    def text(self) -> str:
        """The message's text (text parts joined; other parts, e.g. images, are not served by this policy)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type == "text")


class StreamOptions(_Open):
    include_usage: bool = False


class FunctionDefinition(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of type object; none: no arguments
    strict: bool | None = None  # true: a call under "auto" whose arguments do not validate is not taken as one

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not TOOL_NAME.match(v):
            raise ValueError(f"function name {v!r} is not allowed: 1 to 64 letters, digits, underscores or dashes")
        return v

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        problem = _schema_problem(json.dumps(v, sort_keys=True))
        if problem is not None:
            raise ValueError(f"not a valid JSON Schema: {problem}")
        if v.get("type", "object") != "object":
            raise ValueError(f"the arguments are a JSON object: parameters must be a schema of type object, not "
                             f"{v.get('type')!r}")
        return v


@lru_cache(maxsize=512)
def _schema_problem(schema_json: str) -> str | None:
    """What is wrong with a JSON Schema, checked against its metaschema (agents send the same tools with every call:
    the check, ~4 ms a schema, is done once)."""
    schema = json.loads(schema_json)
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        return str(exc.message)
    return None


class ToolDefinition(_Open):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"]
    function: NamedFunction


class _Sampling(_Open):
    model: str = Field(min_length=1)
    # None: the served policy's default (sampling_defaults.py), not OpenAI's 1.0
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    return_token_ids: bool = False  # vLLM's extension: token ids in the response

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def max_new_tokens(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(None, ge=1)  # None: the served policy's default, as for chat
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported: the answer holds the completion only")
        return v

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError("one prompt per request (send several requests; they are batched)")
            return v[0]
        if isinstance(v, (str, list)) and len(v) == 0:
            raise ValueError("the prompt is empty")
        return v

    def max_new_tokens(self, default: int) -> int:
        return self.max_tokens or default


class ApiError(Exception):
    """An error to answer in OpenAI's format."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def validation_error(exc: ValidationError) -> ApiError:
    """A pydantic error as OpenAI's 400: the first problem, with the field it is about as ``param``."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first.get("loc", ()))
    problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e['msg']}"
                         for e in exc.errors()[:5])
    return ApiError(400, f"Invalid request: {problems}", param=param or None, code="invalid_value")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
