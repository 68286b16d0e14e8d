"""``/v1/sql``: read-only SQL over the spans' tables; a failing query is a 400 with ClickHouse's first line."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from litstream.infra import clickhouse

from .context import context_of, error, read_json

routes = web.RouteTableDef()


@routes.post("/v1/sql")
async def sql(request: web.Request) -> web.Response:
    body = await read_json(request)
    query = body.get("query") if isinstance(body, dict) else None
    if not isinstance(query, str) or not query.strip():
        return error(400, "a non-empty SQL string is required", "query")
    dsn = context_of(request).settings.resolved_clickhouse_dsn
    try:
        res = await asyncio.to_thread(clickhouse.user_sql, dsn, query)
    except clickhouse.NoOwnerError as exc:  # the sink is (re)starting: try again, not a bad query
        return error(503, str(exc))
    except Exception as exc:  # the query's own error or refusal, for the caller
        return error(400, str(exc).strip().splitlines()[0][:2000], "query")
    return web.json_response(res.to_json(), dumps=lambda o: json.dumps(o, default=str))
