"""The dashboard in a real browser (Debian's Chromium driven by Playwright) and every process's /metrics, against
one running stack: lifecycle processor, span sink, triplet processor, trainer, a runner with the demo agent and the
gateway with a token. Screenshots of each page go to ``.litstream/screenshots/`` (``LITSTREAM_SCREENSHOTS`` to
change it)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from litstream.app.stack import Stack
from litstream.infra import health
from litstream.infra.broker import KafkaBroker, free_port
from litstream.infra.kafka import create_topics, producer
from litstream.infra.metrics import LagCollector
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.events import TrainedSample, TripletEmitted, VersionTrained
from tests.waiting import until

TOKEN = "dash-s3cret"
CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(os.environ.get("LITSTREAM_SCREENSHOTS", Path(__file__).resolve().parent.parent / ".litstream" /
                            "screenshots"))


def call(url: str, method: str = "GET", body: Any = None, token: str | None = TOKEN) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, method=method,
                                 headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def stack(broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Settings]]:
    tmp = tmp_path_factory.mktemp("dashboard")
    settings = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=2,
                        data_dir=tmp / "data", clickhouse_dsn=f"chdb://{tmp / 'chdb'}",
                        gateway_token=SecretStr(TOKEN))
    create_topics(settings)
    port = free_port()
    with Stack(settings) as s:
        s.start("lifecycle", "process", "lifecycle")
        s.start("span-sink", "process", "span-sink")
        s.start("triplets", "process", "triplets")
        s.start("trainer", "process", "trainer", "--max-steps", "1")
        s.start("runner", "runner", "--agent", "litstream.workers.demo_agent:arithmetic_agent", "--concurrency", "2")
        s.start("gateway", "gateway", "--port", str(port))
        for name, role in (("lifecycle", "lifecycle"), ("span-sink", "span-sink"), ("gateway", "gateway"),
                           ("runner", "runner"), ("triplets", "triplets"), ("trainer", "trainer")):
            s.wait_ready(name, role, timeout=180)
        yield f"http://127.0.0.1:{port}", settings


def enqueue(base: str, task: dict[str, Any], mode: str = "train") -> str:
    status, body = call(f"{base}/v1/rollouts", "POST", {"input": task, "mode": mode})
    assert status == 201, body
    return str(json.loads(body)["rollout_id"])


def finished(base: str, rid: str) -> bool:
    items = json.loads(call(f"{base}/v1/rollouts")[1])["items"]
    return any(i["rollout_id"] == rid and i["status"] == "succeeded" for i in items)


# -- /metrics ------------------------------------------------------------------------------------------------

EXPECTED = {
    "lifecycle": ["litstream_events_total", "litstream_attempt_timeouts_total", "litstream_retries_total",
                  "litstream_consumer_lag"],
    "span-sink": ["litstream_spans_total", "litstream_sink_rows_total", "litstream_sink_batch_size_bucket",
                  "litstream_sink_batch_seconds_bucket", "litstream_consumer_lag"],
    "triplets": ["litstream_triplets_total", "litstream_triplet_attempts_total", "litstream_consumer_lag"],
    "trainer": ["litstream_trainer_step_seconds_bucket", "litstream_trainer_tokens_per_second",
                "litstream_policy_version", "litstream_trainer_reward_mean", "litstream_trainer_steps_total"],
    "runner": ["litstream_runner_attempts_total", "litstream_runner_spans_total", "litstream_consumer_lag"],
    "gateway": ["litstream_rollouts{", "litstream_queue_depth", "litstream_attempts_retried",
                "litstream_dead_letter_topic_messages"],
}


def series(text: str) -> set[str]:
    return {line.split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_every_process_serves_metrics(stack: tuple[str, Settings]) -> None:
    base, settings = stack
    rid = enqueue(base, {"a": 2, "b": 3, "op": "+"})
    until("the rollout succeeded", lambda: finished(base, rid))
    for role, names in EXPECTED.items():
        info = health.read(settings.data_dir, role)
        assert info is not None and info.get("metrics_url"), f"{role} records no metrics URL: {info}"
        url = info["metrics_url"]
        assert call(f"{url}/healthz", token=None)[0] == 200
        assert until(f"{role} is ready", lambda: call(f"{url}/readyz", token=None)[0] == 200)

        def has_all() -> bool:
            text = call(f"{url}/metrics", token=None)[1].decode()
            return all(any(s.startswith(n) for s in series(text)) for n in names)

        until(f"{role} /metrics has {names}", has_all, timeout=60)
    # The gateway also serves /metrics on its own port, under the token rule.
    assert call(f"{base}/metrics", token=None)[0] == 401
    status, text = call(f"{base}/metrics")
    assert status == 200 and b'litstream_rollouts{status="succeeded"}' in text
    sink_url = health.read(settings.data_dir, "span-sink")["metrics_url"]  # type: ignore[index]

    def spans_counted() -> float | None:
        lines = [ln for ln in call(f"{sink_url}/metrics", token=None)[1].decode().splitlines()
                 if ln.startswith("litstream_spans_total")]
        count = float(lines[0].split()[-1]) if lines else 0.0
        return count if count >= 4 else None

    # the demo agent's four spans at least; the sink stores them on its own path, beside the rollout's status
    until("the span sink counted the spans", spans_counted, timeout=60)


def test_lag_is_read_from_librdkafka_statistics() -> None:
    lag = LagCollector()
    stats = {"topics": {"t.spans": {"partitions": {"0": {"consumer_lag": 7}, "1": {"consumer_lag": -1},
                                                   "-1": {"consumer_lag": 3}}}}}
    lag.on_stats("g", json.dumps(stats))
    lag.on_stats("g", "not json")  # ignored, never raised into librdkafka's thread
    samples = [(s.labels, s.value) for m in lag.collect() for s in m.samples]
    assert samples == [({"group": "g", "topic": "t.spans", "partition": "0"}, 7)]
    lag.on_stats("g", json.dumps({"topics": {}}))  # the partition moved away: its series goes
    assert [s for m in lag.collect() for s in m.samples] == []


# -- the browser --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser_page() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if os.environ.get("LITSTREAM_REQUIRE_BROWSER") or os.environ.get("CI"):
            pytest.fail("no /usr/bin/chromium: CI must install Debian's chromium (.ci/run does: apt-get install "
                        "chromium)")
        pytest.skip("no /usr/bin/chromium: apt-get install chromium to run the browser tests")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        yield page
        browser.close()


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def log_in(page: Any, base: str) -> None:
    """The token rule: a browser without the cookie is asked for the token, and a wrong one is refused."""
    page.goto(f"{base}/")
    assert "/ui/login" in page.url
    page.fill("input[name=token]", "wrong")
    page.click("button[type=submit]")
    assert page.locator(".error").is_visible()
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_selector("#rollout-table")


def rollout_appears_live(page: Any, base: str) -> Any:
    """A rollout enqueued through the API appears without a reload and runs to the end; the filter narrows."""
    rid = enqueue(base, {"a": 4, "b": 5, "op": "+"})
    row = page.locator(f'tr[data-rollout="{rid}"]')
    row.wait_for(timeout=60_000)
    enqueue(base, {"a": 7, "b": 2, "op": "*"}, mode="val")
    page.locator(f'tr[data-rollout="{rid}"] .pill.st-succeeded').wait_for(timeout=120_000)
    shot(page, "rollouts")
    page.select_option("select[name=mode]", "val")
    page.wait_for_function(f"!document.querySelector('tr[data-rollout=\"{rid}\"]')")
    page.select_option("select[name=mode]", "")
    row.wait_for()
    return row


def pages_through(page: Any, base: str) -> None:
    """Over 25 rollouts: a second page, reached with the pager; the live refresh keeps it."""
    for i in range(26):
        enqueue(base, {"a": i, "b": 1, "op": "+"}, mode="test")
    page.goto(f"{base}/")
    page.wait_for_selector("text=page 1 of 2", timeout=60_000)
    page.click("text=older →")
    page.wait_for_selector("text=page 2 of 2")
    page.evaluate("window.swaps = 0; document.addEventListener('htmx:afterSwap', () => window.swaps++)")
    page.wait_for_function("window.swaps >= 2")  # two live refreshes later ...
    assert page.locator("text=page 2 of 2").is_visible()  # ... still the second page
    page.select_option("select[name=status]", "succeeded")  # a new filter starts again at page 1
    page.wait_for_selector("text=page 1 of")


def as_of_shows_the_past(page: Any, base: str, rid: str) -> None:
    """"As of" a moment before its first attempt began, the rollout was queuing: the list and its page say so,
    replayed from the log, while today it has succeeded."""
    snap = json.loads(call(f"{base}/v1/rollouts/{rid}")[1])
    before_attempt = f"{snap['attempts'][0]['start_time'] - 0.002:.3f}"
    page.goto(f"{base}/")
    page.fill("input[name=as_of]", before_attempt)
    page.press("input[name=as_of]", "Enter")
    page.locator(f'tr[data-rollout="{rid}"] .pill.st-queuing').wait_for(timeout=60_000)
    assert page.locator(".as-of").is_visible()
    shot(page, "rollouts-as-of")
    page.locator(f'tr[data-rollout="{rid}"] a').click()
    page.wait_for_selector(".facts .pill.st-queuing")
    assert "As of" in page.locator(".as-of").inner_text()
    page.goto(f"{base}/?as_of=yesterday")
    assert "0:120,1:98" in page.locator(".error").inner_text()  # what a point of the log looks like


def lineage_links_both_ways(page: Any, base: str, settings: Settings, rid: str) -> None:
    """A version's lineage (as the trainer records it) shows on Training, opens onto its data, whose rollout
    links back to the version its triplet went into."""
    snap = json.loads(call(f"{base}/v1/rollouts/{rid}")[1])
    events = EventProducer(settings, role="test")
    events.send(events.topics.triplets, TripletEmitted(  # the rollout's triplet, as the triplet processor makes it
        meta=events.factory.meta(rid), attempt_id=snap["attempts"][0]["attempt_id"], group_id="task-x", index=0,
        policy_version="0", prompt_text="What is 4 + 5?", response_text="9", reward=1.0))
    events.send(events.topics.lineage, VersionTrained(
        **events.factory.stamp(), resources_id="policy-v99", version=99, time=snap["start_time"], window="count",
        samples=[TrainedSample(rollout_id=rid, attempt_id=snap["attempts"][0]["attempt_id"], group_id="task-x",
                               index=0, policy_version=0, reward=1.0)]))
    events.flush()
    events.close()
    page.goto(f"{base}/ui/training")
    page.locator('tr[data-version="99"] a').click(timeout=60_000)
    page.wait_for_selector(f'table.task a[href="/ui/rollouts/{rid}"]')
    shot(page, "version")
    page.locator(f'table.task a[href="/ui/rollouts/{rid}"]').click()
    page.wait_for_selector('#triplets a[href="/ui/versions/99"]', timeout=60_000)


def span_tree_opens(page: Any, row: Any) -> None:
    """One rollout: attempts, the span tree (a row opens onto its attributes), LLM calls."""
    row.locator("a").click()
    page.wait_for_selector(".tl-bar.st-succeeded")
    llm = page.locator(".wf-row:has(.kind.k-llm)").first
    llm.wait_for(timeout=60_000)
    llm.locator("summary").click()
    assert llm.locator("table.attrs").is_visible()
    assert llm.locator("text=gen_ai.prompt.0.content").is_visible()
    assert page.locator(".llm .msg.role-assistant").count() >= 1
    assert page.locator("text=What is 4 + 5?").first.is_visible()
    shot(page, "rollout")


def sql_console_answers(page: Any, base: str) -> None:
    page.goto(f"{base}/ui/sql")
    page.click("#sql-run")
    page.wait_for_selector("#sql-table tbody tr", timeout=60_000)
    assert page.locator("#sql-table").inner_text().count("chat toy-policy") == 1
    assert page.locator(".sql-chart canvas").count() == 1
    shot(page, "sql")
    page.fill("#sql-query", "SELECT nope FROM spans")
    page.click("#sql-run")
    page.wait_for_selector("#sql-result .error")
    page.fill("#sql-query", "DROP TABLE spans")
    page.click("#sql-run")
    page.wait_for_function("document.querySelector('#sql-result .error') && "
                           "/read-only|readonly|Cannot execute/i.test(document.querySelector('#sql-result .error').innerText)")


def test_dashboard_in_a_browser(stack: tuple[str, Settings], browser_page: Any) -> None:
    base, settings = stack
    page = browser_page
    bad = producer(settings)  # a message no processor can decode: the lifecycle processor dead-letters it
    bad.produce(Topics(settings.topic_prefix).rollout_events, key=b"ro-garbage", value=b"not an event")
    bad.flush(10)
    log_in(page, base)
    row = rollout_appears_live(page, base)
    rid = row.get_attribute("data-rollout")
    span_tree_opens(page, row)
    as_of_shows_the_past(page, base, rid)
    lineage_links_both_ways(page, base, settings, rid)
    for path, name, ready in (("/ui/training", "training", "#chart-reward"),
                              ("/ui/resources", "resources", "text=policy-v0"),
                              ("/ui/workers", "workers", "text=span-sink"),
                              ("/ui/dead-letters", "dead-letters", "#dead-letters td.reason")):
        page.goto(f"{base}{path}")
        page.wait_for_selector(ready, timeout=60_000)
        shot(page, name)
    assert "decode" in page.locator("#dead-letters").inner_text()  # the reason's kind, next to its text
    sql_console_answers(page, base)
    pages_through(page, base)
