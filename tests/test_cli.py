"""The command line: help everywhere, and `litstream demo --json` (the closed loop) as scripts use it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from litstream.app.stack import Stack, settings_env
from litstream.infra.clickhouse import ClickHouse
from litstream.infra.settings import Settings
from tests.waiting import until

COMMANDS = [[], ["demo"], ["up"], ["status"], ["topics"], ["topics", "create"], ["topics", "list"], ["process"],
            ["process", "lifecycle"], ["process", "span-sink"], ["process", "triplets"], ["process", "trainer"],
            ["runner"], ["gateway"], ["rollouts"], ["rollout"], ["rollout", "show"], ["cancel"], ["dlq"],
            ["dlq", "tail"], ["sql"], ["report"], ["replay"], ["enqueue"], ["healthcheck"],
            ["policy-server"]]


def run(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "litstream.app.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "litstream")
def test_help(cmd: list[str]) -> None:
    out = run(*cmd, "--help")
    assert out.returncode == 0, out.stderr
    assert "Usage:" in out.stdout
    assert re.search(r"Examples:\n\s+(\S+=\S+ )*litstream ", out.stdout), out.stdout  # every command shows how it is typed


def test_version() -> None:
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("litstream, version ")


@pytest.mark.slow(enabled_by="LITSTREAM_LONG_RUNS")  # a minute or more; CI runs it (.ci/run)
@pytest.mark.timeout(600)
def test_the_closed_loop_publishes_versions_that_reach_spans_and_triplets(tmp_path: Path) -> None:
    """A short closed loop with the tiny policy: each trained version is published as a resources event, the
    runners pick it up, and the spans and triplets they produce name it."""
    out = run("demo", "--steps", "3", "--groups-per-step", "2", "--group-size", "2", "--runners", "1",
              "--concurrency", "4", "--val-samples", "1", "--json", cwd=tmp_path, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["trainer_steps"] == 3
    assert 0 in summary["versions"] and max(summary["versions"]) >= 1  # spans (ClickHouse) of a trained version
    assert any(v not in ("0", "None") for v in summary["triplets_by_version"])  # ... and triplets
    assert set(summary["mean_reward_by_version"]) == {str(v) for v in summary["versions"]}
    assert summary["by_status"] == {"succeeded": summary["rollouts"]}
    assert summary["spans_in_clickhouse"] == summary["spans_emitted"] > 0
    assert summary["triplets"] > 0 and Path(tmp_path / summary["reward_curve"]).exists()
    # One window per published version: every sample trains at most one version after the one that made it.
    steps = [json.loads(line) for line in (tmp_path / summary["data_dir"] / "trainer-metrics.jsonl").open()]
    assert len(steps) == 3 and all(s["version_lag"] <= 1.0 for s in steps)


def test_the_quick_slice_runs_without_training(tmp_path: Path) -> None:
    out = run("demo", "--slice", "--rollouts", "4", "--json", cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["rollouts"] == 4 and summary["by_status"] == {"succeeded": 4}
    assert summary["spans_in_clickhouse"] == summary["spans_emitted"] >= 12


def test_errors_say_what_to_do(tmp_path: Path) -> None:
    env_cwd = tmp_path
    out = subprocess.run([sys.executable, "-m", "litstream.app.cli", "rollouts"], capture_output=True, text=True,
                         timeout=60, cwd=env_cwd,
                         env={**os.environ, "LITSTREAM_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert out.returncode != 0
    out = run("runner", "--agent", "no.such.module:fn", cwd=tmp_path)
    assert out.returncode == 1 and "cannot load agent" in out.stderr


def _cli(settings: Settings, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "litstream.app.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**settings_env(settings), "PATH": "/usr/bin:/bin",
                                                     "COLUMNS": "100"})


def _bare_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITSTREAM_")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.parametrize("cmd", [["rollouts"], ["enqueue", "{}"], ["cancel", "ro-1"], ["dlq", "tail"]])
def test_no_broker_is_one_line_naming_the_address_and_the_fix(cmd: list[str], tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "litstream.app.cli", *cmd], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env=_bare_env(LITSTREAM_BOOTSTRAP_SERVERS="127.0.0.1:1"))
    assert out.returncode == 1
    assert out.stdout == ""  # enqueue printed no id: nothing was stored
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "127.0.0.1:1" in lines[0] and "litstream up" in lines[0], out.stderr


def test_a_misspelled_setting_is_refused_before_anything_runs(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "litstream.app.cli", "status"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env=_bare_env(LITSTREAM_BOOTSTRAP_SERVER="127.0.0.1:9092"))
    assert out.returncode == 2 and "did you mean LITSTREAM_BOOTSTRAP_SERVERS?" in out.stderr


def test_sql_without_a_stack_or_data_says_so_and_creates_nothing(tmp_path: Path) -> None:
    def sql(query: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "litstream.app.cli", "sql", query], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path, env=_bare_env())

    out = sql("SELECT 1")
    assert out.returncode == 1 and "no ClickHouse data" in out.stderr and "litstream up" in out.stderr
    refused = sql("DROP TABLE spans")
    assert refused.returncode == 2 and "DROP is not allowed" in refused.stderr
    assert list(tmp_path.iterdir()) == []


def test_csv_is_rfc4180_with_unix_line_ends_and_tables_wrap(settings: Settings) -> None:
    c = ClickHouse(settings.resolved_clickhouse_dsn, role="test")
    c.migrate()
    c.close()
    out = _cli(settings, "sql", "SELECT 'a,\"b' AS x, 'two\nlines' AS y, 1 AS n", "--format", "csv")
    assert out.returncode == 0, out.stderr
    assert out.stdout == 'x,y,n\n"a,""b","two\nlines",1\n'
    long = "x" * 150
    table = _cli(settings, "sql", f"SELECT '{long}' AS wide")
    assert "…" not in table.stdout and table.stdout.replace("│", "").replace(" ", "").replace("\n", "").count(
        long) == 1  # folded over lines, never cut
    topics = _cli(settings, "topics", "list")
    assert "…" not in topics.stdout


def test_cancel_show_and_the_dead_letter_of_a_refused_cancel(processor_running: Settings) -> None:
    settings = processor_running
    enq = _cli(settings, "enqueue", '{"a": 1, "op": "+", "b": 2}')
    assert enq.returncode == 0, enq.stderr
    rid = enq.stdout.strip()
    first = _cli(settings, "cancel", rid)
    assert first.returncode == 0 and first.stdout.strip() == f"{rid} cancelled", first.stderr
    again = _cli(settings, "cancel", rid)
    assert again.returncode == 2 and "terminal states are final" in again.stderr
    assert _cli(settings, "cancel", "no such id!").returncode == 2
    show = _cli(settings, "rollout", "show", rid)
    assert show.returncode == 0 and f"{rid}: cancelled" in show.stdout and "attempts" in show.stdout
    assert _cli(settings, "rollout", "show", "ro-unknown").returncode == 1

    def refused_cancel_letter() -> bool:  # the processor dead-letters it, a moment after the CLI's own answer
        dlq = _cli(settings, "dlq", "tail", "--json")
        letters = [json.loads(line) for line in dlq.stdout.splitlines()]
        return any("already cancelled" in lt["reason"] and rid in lt["event"] for lt in letters)

    until("the refused cancel's dead letter", refused_cancel_letter, timeout=60, every=1.0)
    assert _cli(settings, "dlq", "tail", "--topic", "nope").returncode == 2


def test_rollout_show_draws_the_span_tree_with_rewards() -> None:
    from litstream.app.show import span_trees

    rows = [["at-1", "a", "", "agent.rollout", 0, 5_000_000, "Ok", None, 1],
            ["at-1", "b", "a", "chat", 1_000_000, 2_000_000, "Ok", None, 2],
            ["at-1", "c", "a", "agentlightning.annotation", 4_000_000, 0, "Ok", 1.0, 3]]
    tree = span_trees(rows)["at-1"]
    assert tree.span.name == "agent.rollout" and [c.span.name for c in tree.children] == [
        "chat", "agentlightning.annotation"]
    assert tree.children[1].span.attributes["reward"] == 1.0


def test_stack_roles_stop_with_the_stack(settings: Settings) -> None:
    """`Stack` keeps its old surface (start, roles, wait_ready) for the demos."""
    with Stack(settings) as stack:
        stack.start("lifecycle", "process", "lifecycle")
        stack.wait_ready("lifecycle", "lifecycle")
        proc = stack.roles["lifecycle"]
    assert not proc.alive()


def test_services_collect_young_objects_less_often() -> None:
    import gc

    from litstream.infra.runtime import YOUNG_COLLECTION_THRESHOLD, tune_gc_for_service

    before = gc.get_threshold()
    try:
        tune_gc_for_service()
        assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, *before[1:])
    finally:
        gc.set_threshold(*before)


def test_enqueue_pins_the_latest_resources(processor_running: Settings) -> None:
    """As the reference's store does: a rollout enqueued without resources runs with the latest published."""
    import asyncio

    from litstream.schemas.models import LLM
    from litstream.streams.stateview import StateView
    from litstream.workers.store import LitStore

    async def publish() -> str:
        store = LitStore(processor_running)
        try:
            await store.wait_until_ready()
            update = await store.add_resources({"main_llm": LLM(endpoint="http://127.0.0.1:1/v1", model="m")})
            return update.resources_id
        finally:
            await store.close()

    latest = asyncio.run(publish())
    enq = _cli(processor_running, "enqueue", "{}")
    assert enq.returncode == 0, enq.stderr
    rid = enq.stdout.strip()
    with StateView(processor_running) as view:
        snap = view.wait_for(lambda: view.snapshots.get(rid), timeout=30)
    assert snap is not None and snap.resources_id == latest
