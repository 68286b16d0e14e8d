"""The OpenAI request and response bodies the server speaks (the subset that matters for a policy endpoint).

Requests are validated; fields this server does not know are accepted and ignored, as OpenAI's own server does
for forward compatibility. Errors use OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: str
    text: str | None = None


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text (text parts joined; other parts, e.g. images, are not served by this policy)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type == "text")


class StreamOptions(_Open):
    include_usage: bool = False


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
