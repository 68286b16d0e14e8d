"""The dashboard's pages and fragments, added to the gateway by :func:`add_dashboard_routes`.

Server-rendered HTML (Jinja2) with htmx: each page is a shell whose live parts are fragments the browser polls
(``hx-trigger="every 2s"``), so lists update without reload; charts are Chart.js, fed JSON. Both libraries are
vendored under ``static/`` — no page needs the internet. The gateway's token rule applies: a browser presents the
token once (``/ui/login`` or ``?token=``) and keeps it in an HttpOnly cookie that stands for the bearer header.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from litstream.infra import clickhouse, health, metrics
from litstream.infra.settings import Settings
from litstream.schemas.events import RolloutSnapshot
from litstream.schemas.models import ROLLOUT_STATUSES
from litstream.schemas.policy_versions import parse_policy_version
from litstream.streams.replay import parse_until
from litstream.workers import runs
from litstream.workers.store import LitStore

from . import data
from .auth import add_cookie_auth
from .deadletters import DeadLetterFeed
from .gauges import register_gateway_gauges
from .history import PastPoint, PastStates

HERE = Path(__file__).parent
ROLES = ("lifecycle", "span-sink", "triplets", "trainer", "gateway", "runner")
TRAINER_METRICS_FILE = "trainer-metrics.jsonl"  # written by the trainer (trainer/process.py METRICS_FILE)
ROLLOUT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
SQL_ROW_LIMIT = 1000
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

REWARD_SQL = """
SELECT s.resources_id, e.mode, avg(s.reward), count()
FROM (SELECT rollout_id, resources_id, reward FROM spans FINAL WHERE reward IS NOT NULL) AS s
LEFT JOIN (SELECT rollout_id, any(mode) AS mode FROM rollout_events FINAL
           WHERE event_type = 'RolloutEnqueued' GROUP BY rollout_id) AS e USING rollout_id
GROUP BY s.resources_id, e.mode
"""
SPAN_FACTS_SQL = """
SELECT rollout_id, argMax(resources_id, sequence_id), argMaxIf(reward, sequence_id, reward IS NOT NULL)
FROM spans FINAL WHERE has({ids:Array(String)}, rollout_id) GROUP BY rollout_id
"""
USING_SQL = "SELECT DISTINCT rollout_id FROM spans WHERE position(resources_id, {resources:String}) > 0"
VERSIONS_SQL = """
SELECT version, count() AS triplets, uniqExact(group_id) AS tasks, avg(reward) AS reward, avg(staleness) AS staleness,
       max(trained_time) AS trained
FROM version_data GROUP BY version ORDER BY version DESC LIMIT 50
"""
TRIPLETS_SQL = """
SELECT t.attempt_id, t.`index`, t.policy_version, t.reward, t.prompt_text, t.response_text,
       length(t.prompt_token_ids), length(t.response_token_ids), ifNull(v.trained_into, [])
FROM (SELECT * FROM triplets FINAL WHERE rollout_id = {rid:String}) AS t
LEFT JOIN (SELECT attempt_id, `index`, trained_into FROM triplet_versions WHERE rollout_id = {rid:String}) AS v
ON t.attempt_id = v.attempt_id AND t.`index` = v.`index`
ORDER BY t.attempt_id, t.`index`
"""


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["age"] = data.age
    env.filters["clock"] = lambda t: time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"
    env.filters["tojson_attr"] = lambda v: json.dumps(v, default=str)
    env.globals["statuses"] = ROLLOUT_STATUSES
    env.globals["modes"] = data.MODES
    env.globals["since_choices"] = data.SINCE_CHOICES
    env.globals["lines"] = data.resource_lines
    return env


class Dashboard:
    def __init__(self, settings: Settings, store: LitStore) -> None:
        self.settings = settings
        self.store = store
        self.env = _environment()
        self._letters: DeadLetterFeed | None = None
        self._letters_lock = threading.Lock()  # the page (a worker thread) and a scrape (the metrics thread)
        self.history = PastStates(settings)

    # -- helpers --------------------------------------------------------------------------------------------

    def render(self, template: str, status: int = 200, **context: Any) -> web.Response:
        html = self.env.get_template(template).render(**context)
        return web.Response(text=html, status=status, content_type="text/html")

    def page(self, template: str, title: str, active: str, **context: Any) -> web.Response:
        return self.render(template, title=title, active=active, **context)

    async def sql(self, query: str, parameters: clickhouse.Parameters | None = None) -> clickhouse.QueryResult:
        """Read-only SQL through the chDB owner; values go in ``parameters`` ({name:Type} placeholders)."""
        return await asyncio.to_thread(clickhouse.user_sql, self.settings.resolved_clickhouse_dsn, query,
                                       parameters=parameters)

    def letters(self) -> DeadLetterFeed:
        """The dead-letter feed, started by the first page view or scrape that needs it."""
        with self._letters_lock:
            if self._letters is None:
                self._letters = DeadLetterFeed(self.settings)
            return self._letters

    def close(self) -> None:
        if self._letters is not None:
            self._letters.close()

    # -- rollouts -------------------------------------------------------------------------------------------

    async def rollouts_page(self, request: web.Request) -> web.Response:
        f, error = _filter(request)
        return self.page("rollouts.html", "Rollouts", "rollouts", f=f, error=error)

    async def rollouts_fragment(self, request: web.Request) -> web.Response:
        f, error = _filter(request)
        if error:
            return self.render("error.html", status=400, message=error)
        try:
            snapshots, past = await self.snapshots_at(f.as_of)
        except (ValueError, LookupError, TimeoutError) as exc:
            return self.render("error.html", status=400, message=f"as of {f.as_of}: {exc}")
        used = await self.rollouts_using(f.resources_id) if f.resources_id else frozenset()
        now = past.time if past is not None and past.time is not None else time.time()
        page = data.rollout_page(snapshots.values(), f, now=now, used=used)
        # A span's facts (resources used, reward) may come from after the point: not shown as of then.
        facts = await self.span_facts([s.rollout_id for s in page.items]) if past is None else {}
        return self.render("rollouts_list.html", page=page, f=f, facts=facts, now=now, past=past)

    async def snapshots_at(self, as_of: str) -> tuple[dict[str, RolloutSnapshot], PastPoint | None]:
        """The rollouts now (the store's view), or as they were at ``as_of`` (replayed; ValueError for a point
        that is not one), with that point."""
        if not as_of:
            return self.store.rollouts.snapshots, None
        return await asyncio.to_thread(self.history.at, parse_until(as_of))

    async def snapshot_at(self, rollout_id: str, as_of: str) -> tuple[RolloutSnapshot | None, PastPoint | None]:
        """One rollout now (the store's, read from ClickHouse if its replica let go of it) or at ``as_of``."""
        if not as_of:
            return await self.store.reads.snapshot(rollout_id), None
        snapshots, past = await self.snapshots_at(as_of)
        return snapshots.get(rollout_id), past

    async def span_facts(self, rollout_ids: list[str]) -> dict[str, tuple[str, float | None]]:
        """Per rollout, from its spans: the resources it ran with and its last reward. Empty when the spans
        cannot be read now (the list still shows)."""
        if not rollout_ids:
            return {}
        try:
            rows = (await self.sql(SPAN_FACTS_SQL, {"ids": list(rollout_ids)})).rows
        except Exception:  # noqa: BLE001 - missing columns beat a missing list
            return {}
        return {str(r[0]): (str(r[1]), None if r[2] is None else float(r[2])) for r in rows}

    async def rollouts_using(self, resources: str) -> frozenset[str]:
        try:
            rows = (await self.sql(USING_SQL, {"resources": resources})).rows
        except Exception:  # noqa: BLE001 - then the filter matches on what the rollouts asked for only
            return frozenset()
        return frozenset(str(r[0]) for r in rows)

    async def rollout_page(self, request: web.Request) -> web.Response:
        rid, as_of = _rollout_id(request), request.query.get("as_of", "").strip()
        try:
            snap, past = await self.snapshot_at(rid, as_of)
        except (ValueError, LookupError, TimeoutError) as exc:
            return self.render("error.html", status=400, title="Rollout", active="rollouts", page_shell=True,
                               message=f"as of {as_of}: {exc}")
        if snap is None:
            when = f" as of {past.label}" if past is not None else " (yet): it appears here once the lifecycle " \
                                                                  "processor has applied it"
            return self.render("error.html", status=404, title="Rollout", active="rollouts", page_shell=True,
                               message=f"no rollout {rid!r}{when}")
        return self.page("rollout.html", f"Rollout {rid}", "rollouts", snap=snap, past=past, as_of=as_of)

    async def rollout_summary(self, request: web.Request) -> web.Response:
        rid, as_of = _rollout_id(request), request.query.get("as_of", "").strip()
        try:
            snap, past = await self.snapshot_at(rid, as_of)
        except (ValueError, LookupError, TimeoutError) as exc:
            return self.render("error.html", status=400, message=f"as of {as_of}: {exc}")
        if snap is None:
            return self.render("error.html", status=404, message=f"no rollout {rid!r}")
        now = past.time if past is not None and past.time is not None else None
        return self.render("rollout_summary.html", snap=snap, bars=data.attempt_timeline(snap, now))

    async def rollout_traces(self, request: web.Request) -> web.Response:
        rid = _rollout_id(request)
        try:
            snap = await self.store.reads.snapshot(rid)
            spans = (await self.store.query_spans(rid)).items
            triplets = (await self.sql(TRIPLETS_SQL, {"rid": rid})).rows
        except Exception as exc:  # noqa: BLE001 - the sink may be down: say so on the page
            return self.render("error.html", status=503, message=f"spans are not readable now: {exc}")
        finished = snap is not None and snap.status in ("succeeded", "failed", "cancelled")
        return self.render("rollout_traces.html", rid=rid, rows=data.waterfall(spans), calls=data.llm_calls(spans),
                           rewards=data.rewards(spans), triplets=triplets, live=not finished, spans=len(spans))

    # -- training -------------------------------------------------------------------------------------------

    async def training_page(self, _: web.Request) -> web.Response:
        return self.page("training.html", "Training", "training")

    async def versions_fragment(self, _: web.Request) -> web.Response:
        """The newest versions with what trained them (lineage), each linking to its data."""
        try:
            rows = (await self.sql(VERSIONS_SQL)).rows
        except Exception as exc:  # noqa: BLE001 - the sink may be down: say so on the page
            return self.render("error.html", status=503, message=f"lineage is not readable now: {exc}")
        return self.render("versions_list.html", rows=rows)

    async def version_page(self, request: web.Request) -> web.Response:
        text = request.match_info["version"]
        if not text.isdigit():
            raise web.HTTPBadRequest(text=f"{text!r} is not a policy version (a number)")
        try:
            lineage = await self.store.version_lineage(int(text))
        except Exception as exc:  # noqa: BLE001 - the sink may be down: say so on the page
            return self.render("error.html", status=503, title=f"Policy v{text}", active="training",
                               page_shell=True, message=f"lineage is not readable now: {exc}")
        return self.page("version.html", f"Policy v{text}: what trained it", "training", lineage=lineage)

    async def training_json(self, _: web.Request) -> web.Response:
        path = self.settings.data_dir / TRAINER_METRICS_FILE
        records = await asyncio.to_thread(_read_jsonl, path)
        body: dict[str, Any] = {"steps": data.step_series(records)}
        try:
            body["rewards"] = data.reward_series((await self.sql(REWARD_SQL)).rows)
            body["runs"] = data.run_series(await asyncio.to_thread(self._runs))
        except Exception as exc:  # noqa: BLE001 - shown next to the chart
            body["rewards"], body["error"] = {"labels": [], "series": {}}, f"rewards: {exc}"
            body["runs"] = {"labels": [], "series": {}}
        latest = self.store.resources.state.latest
        body["latest_resources"] = latest.resources_id if latest is not None else None
        if body["steps"]["current_version"] is None and latest is not None:  # no step yet: the published one
            body["steps"]["current_version"] = parse_policy_version(latest.resources_id)
        return web.json_response(body)

    def _runs(self) -> list[runs.RunSummary]:
        dsn = self.settings.resolved_clickhouse_dsn
        return runs.list_runs(lambda sql: clickhouse.user_sql(dsn, sql), runs.run_records(self.settings.data_dir))

    # -- resources, workers, dead letters --------------------------------------------------------------------

    async def simple_page(self, request: web.Request) -> web.Response:
        name = request.match_info["page"]
        titles = {"resources": "Resources and versions", "workers": "Workers and processes",
                  "dead-letters": "Dead letters", "sql": "SQL console"}
        if name not in titles:
            raise web.HTTPNotFound(text=f"no dashboard page {name!r}; pages: {', '.join(titles)}")
        return self.page(f"{name.replace('-', '_')}.html", titles[name], name)

    async def resources_fragment(self, _: web.Request) -> web.Response:
        items = sorted(self.store.resources.state.by_id.values(), key=lambda r: r.update_time, reverse=True)
        latest = self.store.resources.state.latest
        return self.render("resources_list.html", items=items,
                           latest=latest.resources_id if latest is not None else None, now=time.time())

    async def workers_fragment(self, _: web.Request) -> web.Response:
        workers = sorted(self.store.workers.workers.values(), key=lambda w: w.last_heartbeat_time or 0, reverse=True)
        processes = [(role, health.read(self.settings.data_dir, role)) for role in ROLES]
        return self.render("workers_list.html", workers=workers, processes=processes, now=time.time())

    async def dead_letters_fragment(self, _: web.Request) -> web.Response:
        feed = await asyncio.to_thread(self.letters)
        counts = sorted(feed.counts().items())
        return self.render("dead_letters_list.html", letters=feed.letters(), counts=counts, error=feed.error,
                           now=time.time())

    # -- SQL ------------------------------------------------------------------------------------------------

    async def sql_fragment(self, request: web.Request) -> web.Response:
        form = await request.post()
        query = str(form.get("query", "")).strip()
        if not query:
            return self.render("error.html", status=400, message="type a query first, e.g. SELECT count() FROM spans")
        started = time.perf_counter()
        try:
            res = await self.sql(query)
        except Exception as exc:  # noqa: BLE001 - the query's own error, for the user
            return self.render("error.html", status=400, message=str(exc).strip().splitlines()[0][:2000])
        took = (time.perf_counter() - started) * 1000
        rows = res.rows[:SQL_ROW_LIMIT]
        chart = data.sql_chart(res.columns, res.types, rows)
        return self.render("sql_result.html", res=res, rows=rows, total=len(res.rows), took_ms=took, chart=chart,
                           limit=SQL_ROW_LIMIT)

    async def metrics_route(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _filter(request: web.Request) -> tuple[data.RolloutFilter, str | None]:
    try:
        return data.RolloutFilter.from_query(request.query), None
    except data.BadFilter as exc:
        return data.RolloutFilter(), str(exc)


def _rollout_id(request: web.Request) -> str:
    rid = request.match_info["rid"]
    if not ROLLOUT_ID.match(rid):
        raise web.HTTPBadRequest(text=f"{rid!r} is not a rollout id (letters, digits, . _ : -)")
    return rid


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written right now
    return out


def add_dashboard_routes(app: web.Application, settings: Settings, store: LitStore) -> Dashboard:
    """The dashboard at ``/`` and ``/ui/...``, ``/metrics`` for Prometheus, and the browser's token cookie."""
    d = Dashboard(settings, store)
    token = settings.gateway_token.get_secret_value() if settings.gateway_token else ""
    add_cookie_auth(app, token, d.env)
    register_gateway_gauges(store, d.letters)
    r = app.router
    r.add_get("/", d.rollouts_page)
    r.add_get("/metrics", d.metrics_route)
    r.add_get("/ui/f/rollouts", d.rollouts_fragment)
    r.add_get("/ui/rollouts/{rid}", d.rollout_page)
    r.add_get("/ui/f/rollouts/{rid}/summary", d.rollout_summary)
    r.add_get("/ui/f/rollouts/{rid}/traces", d.rollout_traces)
    r.add_get("/ui/training", d.training_page)
    r.add_get("/ui/f/versions", d.versions_fragment)
    r.add_get("/ui/versions/{version}", d.version_page)
    r.add_get("/ui/api/training", d.training_json)
    r.add_get("/ui/f/resources", d.resources_fragment)
    r.add_get("/ui/f/workers", d.workers_fragment)
    r.add_get("/ui/f/dead-letters", d.dead_letters_fragment)
    r.add_post("/ui/f/sql", d.sql_fragment)
    r.add_get("/ui/{page}", d.simple_page)
    r.add_static("/ui/static", HERE / "static")

    async def ready(_: web.Application) -> None:
        metrics.mark_ready()

    async def close(_: web.Application) -> None:
        d.close()

    app.on_startup.append(ready)
    app.on_cleanup.append(close)
    return d
