"""The policy endpoint: an OpenAI-compatible server that serves the current policy and records every call as a span.

See ``docs/policy-server.md``. Modules: ``openai_api`` (request and response bodies), ``backends`` (the torch engine
with batching, or an OpenAI-compatible upstream), ``recorder`` (spans, sequence ids, heartbeats), ``versions``
(following the published policy, publishing the server as a ``ProxyLLM``), ``tool_calls`` (tool calling: the
forms, the generic template, the request's tools, parsing), ``app`` (the aiohttp routes).
"""
