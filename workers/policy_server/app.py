"""The aiohttp application: OpenAI's routes, plain and per attempt, answered by a backend and recorded as spans.

Routes (each also under ``/rollout/{rid}/attempt/{aid}``, the URL a ``ProxyLLM`` resolves to for an attempt):
``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming with ``"stream": true``, SSE ending in
``data: [DONE]``), ``GET /v1/models``; and ``GET /health`` (version and counters).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from litstream.schemas.events import AttrValue

from .backends import Backend, Sampling
from .continuations import Continuations
from .openai_api import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    new_id,
    now,
    validation_error,
)
from .recorder import CallScope, SpanDraft, SpanRecorder
from .responses import Call, full_response, models_list, span_attributes, sse, stream_chunks
from .sampling_defaults import SamplingDefaults
from .tool_calls import ToolAnswer, ToolPlan, answer_tools, plan_tools

log = logging.getLogger("litstream.policy_server")
ATTEMPT_PREFIX = "/rollout/{rid}/attempt/{aid}"
DEFAULT_MAX_TOKENS = 256


@dataclass
class PolicyServer:
    backend: Backend
    recorder: SpanRecorder
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    api_key: str | None = None  # callers must send it as a bearer token
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)  # for what a request leaves out
    started: int = field(default_factory=now)
    continuations: Continuations | None = None  # each attempt's last token ids, for its next prompt
    stats: dict[str, int] = field(default_factory=lambda: {"calls": 0, "errors": 0, "streams": 0,
                                                           "disconnects": 0, "tool_calls": 0,
                                                           "tool_calls_malformed": 0})

    # -- a call ---------------------------------------------------------------------------------------------

    def __post_init__(self) -> None:
        if self.continuations is None:
            self.continuations = Continuations(lambda ids: self.backend.decode(ids, skip_special=False))

    async def scope_of(self, request: web.Request) -> CallScope:
        rid, aid = request.match_info.get("rid"), request.match_info.get("aid")
        if rid is None or aid is None:
            return CallScope()
        return await self.recorder.scope(rid, aid)

    def sampling(self, req: ChatCompletionRequest | CompletionRequest, prompt: list[int]) -> Sampling:
        """What the call samples with: what it names, the served policy's defaults for the rest."""
        d = self.defaults
        limit = getattr(self.backend, "max_positions", None)
        default = d.max_tokens or self.default_max_tokens
        if limit is not None:  # an unset max_tokens fills what the context leaves, up to the default
            default = max(1, min(default, int(limit) - len(prompt)))
        return Sampling(max_new_tokens=req.max_new_tokens(default),
                        temperature=d.temperature if req.temperature is None else req.temperature,
                        top_p=d.top_p if req.top_p is None else req.top_p, seed=req.seed, stops=tuple(req.stops()))

    def defaults_in_force(self) -> dict[str, Any]:
        return {**self.defaults.as_dict(), "max_tokens": self.defaults.max_tokens or self.default_max_tokens}

    def follow_defaults(self, params: Mapping[str, Any], source: str) -> None:
        """A published policy version's sampling parameters become the defaults (the follower calls it)."""
        self.defaults = self.defaults.merged(params, source)

    async def answer(self, request: web.Request, kind: str) -> web.StreamResponse:
        started_ns = time.time_ns()
        req = await _parse(request, ChatCompletionRequest if kind == "chat" else CompletionRequest)
        plan = plan_tools(req) if isinstance(req, ChatCompletionRequest) else None
        scope = await self.scope_of(request)
        attempt = f"{scope.rollout_id}/{scope.attempt_id}" if scope.attributed else None
        if isinstance(req, ChatCompletionRequest):
            messages = [(str(m.role), m.text()) for m in req.messages]
            prompt = self._chat_prompt(plan, messages)
            if attempt is not None and self.continuations is not None:
                prompt = self.continuations.align(attempt, prompt)
        else:
            assert isinstance(req, CompletionRequest)
            prompt = self.backend.text_prompt(req.prompt)  # type: ignore[arg-type]
            text = req.prompt if isinstance(req.prompt, str) else self.backend.decode(req.prompt)  # type: ignore[arg-type]
            messages = [("user", text)]
        sampling = self.sampling(req, prompt)
        if plan is not None and plan.forced:  # constrained to a call of the tools
            sampling = replace(sampling, grammar=plan.grammar(self.backend.tool_template.form))
        reserved = asyncio.ensure_future(self.recorder.reserve(scope, req.n))  # meanwhile, the policy samples
        try:
            answer = await self.backend.generate(prompt, req.n, sampling)
        except BaseException:
            reserved.cancel()
            raise
        self.stats["calls"] += 1
        if attempt is not None and self.continuations is not None:
            self.continuations.remember(attempt, [prompt + g.token_ids for g in answer.generations])
        call = Call(kind=kind, response_id=new_id("chatcmpl" if kind == "chat" else "cmpl"), created=now(),
                    requested_model=req.model, served_model=self.backend.model_name, prompt_token_ids=prompt,
                    messages=messages, generations=answer.generations, version=answer.version,
                    logprobs=bool(req.logprobs) if kind == "chat" else req.logprobs is not None,
                    token_ids=req.return_token_ids)
        if plan is not None and plan.used:
            call.tools = self._answered_tools(plan, call, sampling)
        meta = _Recording(self, scope, call, sampling, request.path, started_ns, reserved,
                          defaulted=_defaulted(req))
        if req.stream:
            return await self._stream(request, call, req.include_usage(), meta)
        body = full_response(call, self.backend.decode)
        await meta.record()
        return web.json_response(body)

    def _chat_prompt(self, plan: ToolPlan | None, messages: list[tuple[str, str]]) -> list[int]:
        """A conversation with tools offered or calls in its history is rendered with them (``tool_calls``)."""
        if plan is None or not plan.used:
            return self.backend.chat_prompt(messages)
        return self.backend.tool_chat_prompt(plan.turns, plan.definitions())

    def _answered_tools(self, plan: ToolPlan, call: Call, sampling: Sampling) -> ToolAnswer:
        tools = answer_tools(plan, self.backend.tool_template.form, [g.text for g in call.generations],
                             constrained=sampling.grammar is not None, grammar=sampling.grammar)
        self.stats["tool_calls"] += sum(len(tools.calls(i)) for i in range(len(call.generations)))
        self.stats["tool_calls_malformed"] += tools.malformed
        return tools

    async def _stream(self, request: web.Request, call: Call, include_usage: bool,
                      meta: _Recording) -> web.StreamResponse:
        self.stats["streams"] += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await resp.prepare(request)
            for chunk in stream_chunks(call, self.backend.decode, include_usage):
                await resp.write(sse(chunk))
            await resp.write(sse("[DONE]"))
            await resp.write_eof()
        except ConnectionError as exc:
            self._disconnected(meta, exc)
        except asyncio.CancelledError as exc:  # the server cancels handlers of clients that went away
            self._disconnected(meta, exc)
            raise
        finally:
            # The tokens were sampled whatever the client read: the span records them, marked when cut short.
            await asyncio.shield(meta.record())
        return resp

    def _disconnected(self, meta: _Recording, exc: BaseException) -> None:
        self.stats["disconnects"] += 1
        meta.disconnected = f"client disconnected mid-stream ({type(exc).__name__})"
        log.info("%s: %s", meta.call.response_id, meta.disconnected)


@dataclass
class _Recording:
    server: PolicyServer
    scope: CallScope
    call: Call
    sampling: Sampling
    path: str
    started_ns: int
    reserved: asyncio.Future[int]
    defaulted: list[str] = field(default_factory=list)  # the sampling parameters the policy's defaults filled
    disconnected: str | None = None

    async def record(self) -> None:
        end_ns = time.time_ns()
        params: dict[str, AttrValue] = {"temperature": self.sampling.temperature, "top_p": self.sampling.top_p,
                                        "max_tokens": self.sampling.max_new_tokens, "seed": self.sampling.seed}
        drafts = []
        for i, gen in enumerate(self.call.generations):
            attrs = span_attributes(self.call, gen, i, params, self.path)
            if self.defaulted:
                attrs["litstream.sampling.defaulted"] = list(self.defaulted)
            if self.disconnected:
                attrs["litstream.stream.disconnected"] = True
            drafts.append(SpanDraft(name=f"{self.call.kind} {self.call.requested_model}", start_ns=self.started_ns,
                                    end_ns=end_ns, attributes=attrs,
                                    status_code="ERROR" if self.disconnected else "OK",
                                    status_message=self.disconnected))
        first = await self.reserved
        self.server.recorder.record(self.scope, first, drafts)


def _defaulted(req: ChatCompletionRequest | CompletionRequest) -> list[str]:
    """The sampling parameters the request left to the policy's defaults."""
    named_max = req.max_tokens is not None or getattr(req, "max_completion_tokens", None) is not None
    return [name for name, named in (("temperature", req.temperature is not None), ("top_p", req.top_p is not None),
                                     ("max_tokens", named_max)) if not named]


async def _parse(request: web.Request, model: type[ChatCompletionRequest] | type[CompletionRequest]) -> Any:
    try:
        raw = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"The body is not valid JSON ({exc}); send a JSON object, e.g. "
                            '{"model": "policy", "messages": [{"role": "user", "content": "hi"}]}',
                       code="invalid_json") from None
    if not isinstance(raw, dict):
        raise ApiError(400, "The body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise validation_error(exc) from None


# --- the application ---------------------------------------------------------------------------------------

SERVER: web.AppKey[PolicyServer] = web.AppKey("server", PolicyServer)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    server = request.app[SERVER]
    try:
        _authorize(request, server.api_key)
        return await handler(request)
    except ApiError as exc:
        server.stats["errors"] += 1
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response(ApiError(exc.status, f"{exc.reason}: {request.method} {request.path} (routes: "
                                          "/v1/chat/completions, /v1/completions, /v1/models, optionally under "
                                          "/rollout/{rid}/attempt/{aid})", code=str(exc.status)).body(),
                                 status=exc.status)
    except Exception as exc:  # the engine failed: the client gets OpenAI's server error, the log the traceback
        server.stats["errors"] += 1
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response(ApiError(500, f"The policy failed to answer: {type(exc).__name__}: {exc}",
                                          "server_error").body(), status=500)


def _authorize(request: web.Request, api_key: str | None) -> None:
    if not api_key or request.path == "/health":
        return
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
        raise ApiError(401, "Missing or wrong API key: send Authorization: Bearer <key> (the `api_key` of an OpenAI "
                            "client), the key set in LITSTREAM_POLICY_SERVER_TOKEN", code="invalid_api_key")


def build_app(server: PolicyServer) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=16 << 20)
    app[SERVER] = server

    async def chat(request: web.Request) -> web.StreamResponse:
        return await server.answer(request, "chat")

    async def completions(request: web.Request) -> web.StreamResponse:
        return await server.answer(request, "text_completion")

    async def models(request: web.Request) -> web.Response:
        await server.scope_of(request)
        return web.json_response(models_list([server.backend.model_name], server.started, server.backend.version,
                                             server.defaults_in_force()))

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"version": server.backend.version, "model": server.backend.model_name,
                                  **server.stats, "recorder": server.recorder.stats})

    for prefix in ("", ATTEMPT_PREFIX):
        app.router.add_post(prefix + "/v1/chat/completions", chat)
        app.router.add_post(prefix + "/v1/completions", completions)
        app.router.add_get(prefix + "/v1/models", models)
    app.router.add_get("/health", health)
    return app
