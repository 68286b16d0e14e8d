"""Trainer.fit / dev over the embedded stack: the rollouts it makes, validation, Baseline, a user algorithm,
bad input. Tests of the embedded path (GRPO with its trainer, Ctrl-C and resume, a killed runner) bring up their
own stack (broker, pipeline, policy server, runners) with tiny settings; tests that only need a running pipeline
share one (`joined`): the driver joins it (``join=True``) and each test runs its own runner, with its own agent,
on its own rollouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from litstream.app.fit import FitSummary, StackDriver, Trainer, agent_path, load_dataset
from litstream.app.stack import Stack
from litstream.infra import clickhouse
from litstream.infra.broker import KafkaBroker
from litstream.infra.kafka import create_topics
from litstream.infra.settings import Settings
from litstream.schemas.models import LLM
from litstream.schemas.policy_versions import POLICY_RESOURCE, policy_resources_id
from litstream.trainer.algorithm import GRPO, VAL, Algorithm, Baseline, Driver, run_all, wait_for_policy
from litstream.trainer.rft import RftConfig
from litstream.workers.runs import list_runs, run_records

TASKS = [{"letter": "a", "count": 1}, {"letter": "b", "count": 2}, {"letter": "c", "count": 1}]
VAL_TASKS = [{"letter": "d", "count": 2}, {"letter": "a", "count": 2}]


def _settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", partitions=2)


@pytest.fixture(scope="module")
def shared_stack(broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """What ``Trainer.fit`` starts when nothing trains (lifecycle processor, span sink, the policy server fronting
    version 0 of the tiny policy), once for the tests of this module that only need it running."""
    from rich.console import Console

    root = tmp_path_factory.mktemp("fit-stack")
    settings = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=2,
                        data_dir=root / "data", clickhouse_dsn=f"chdb://{root / 'chdb'}")
    create_topics(settings)
    with Stack(settings) as stack:
        stack.start("lifecycle", "process", "lifecycle")
        stack.start("span-sink", "process", "span-sink")
        stack.start("policy-server", "policy-server", "--port", "0", "--publish", "--model", "tiny")
        stack.wait_ready("lifecycle", "lifecycle")
        stack.wait_ready("span-sink", "span-sink", key="inserted")
        stack.wait_ready("policy-server", "policy-server", key="url", timeout=600)
        driver = StackDriver(settings, None, Console(quiet=True))
        try:
            driver.serving_through_proxy = True  # ready once the server fronts version 0
            driver.publish({POLICY_RESOURCE: LLM(endpoint="tiny://initial", model="tiny-policy", version=0)},
                           policy_resources_id(0))
            wait_for_policy(driver, lambda p: True, 120.0)
        finally:
            driver.close()
        yield stack


@pytest.fixture
def joined(shared_stack: Stack) -> Iterator[Callable[..., Trainer]]:
    """``joined(agent, **trainer_args)``: a Trainer joining the shared stack, where one runner of ``agent`` runs
    for this test only (stopped after it: the next test's rollouts go to its own runner)."""
    started: list[str] = []

    def trainer(agent: str, **kwargs: Any) -> Trainer:
        name = f"runner-{uuid.uuid4().hex[:6]}"
        shared_stack.start(name, "runner", "--agent", agent, "--concurrency", str(kwargs.get("concurrency", 4)))
        started.append(name)
        return Trainer(settings=shared_stack.settings, join=True, quiet=True, **kwargs)

    yield trainer
    for name in started:
        shared_stack.children.pop(name).proc.stop()


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, GRPO, FitSummary]:
    """A small GRPO run of the tiny policy, validating each version; its data dir, algorithm and summary."""
    settings = _settings(tmp_path_factory.mktemp("grpo-run"))
    algorithm = GRPO(group_size=2, groups_per_step=1, passes=1, val_every=1, window_seconds=5.0, in_flight=4)
    summary = Trainer(algorithm=algorithm, n_runners=1, concurrency=4, settings=settings,
                      quiet=True).fit("tests.fit_agents:two_dimension_agent", TASKS, VAL_TASKS)
    return settings, algorithm, summary


@pytest.mark.timeout(900)
def test_fit_makes_n_times_group_size_training_rollouts_and_validates_each_version(
        grpo_run: tuple[Settings, GRPO, FitSummary]) -> None:
    _, algorithm, summary = grpo_run
    train = algorithm.history.train
    assert sum(len(rs) for rs in train.values()) == len(TASKS) * 2
    assert summary.failed == 0
    assert 0 in summary.val_reward_by_version  # version 0 is validated before training
    assert max(summary.val_reward_by_version) >= 1  # and a trained version after it
    for rewards in algorithm.history.val.values():
        assert len(rewards) == len(VAL_TASKS)
    assert summary.rollouts == len(TASKS) * 2 + len(VAL_TASKS) * len(summary.val_reward_by_version)
    # The reward's other dimension is validated beside it.
    v0 = summary.extra["validation"]["0"]
    assert v0["dimensions"] == {"one": {"mean": 1.0, "se": 0.0}} and 0.0 <= v0["mean"] <= 1.0
    # Every event the run's stack wrote carries its run id, down to the tables.
    assert summary.run_id is not None and summary.run_id.startswith("run-")
    dsn = Settings(data_dir=Path(summary.data_dir)).resolved_clickhouse_dsn
    for table in ("rollout_events", "spans", "triplets"):
        assert clickhouse.query(dsn, f"SELECT DISTINCT run_id FROM {table}").rows == [[summary.run_id]], table
    # `litstream runs` finds it in its history, as the summary gives it.
    (run,) = list_runs(lambda sql: clickhouse.query(dsn, sql), run_records(Path(summary.data_dir)))
    assert (run.run_id, run.name, run.status, run.rollouts) == (summary.run_id, "train", "finished", summary.rollouts)
    assert {label: score.mean for label, score in run.validation.items()} == pytest.approx(
        {f"v{v}": r for v, r in summary.val_reward_by_version.items()})


@pytest.mark.slow(enabled_by="LITSTREAM_LONG_RUNS")  # a minute or more; CI runs it (.ci/run)
@pytest.mark.timeout(900)
def test_a_warm_start_fine_tunes_version_0_on_an_earlier_runs_best_trajectories(
        grpo_run: tuple[Settings, GRPO, FitSummary]) -> None:
    """A second run in the same data dir names the first: its version 0 is the tiny policy fine-tuned (TRL's
    SFTTrainer) on the first run's training trajectories, before any rollout of its own; with no version to
    train, the run validates that version and publishes it as its best."""
    from safetensors.torch import load_file

    settings, _, first = grpo_run
    assert first.run_id is not None
    warm = GRPO(group_size=2, groups_per_step=1, max_versions=0, window_seconds=5.0, in_flight=4,
                warm_start=first.run_id[:-2], rft=RftConfig(min_reward=0.0, epochs=1))
    summary = Trainer(algorithm=warm, n_runners=1, concurrency=4, settings=settings,
                      quiet=True).fit("tests.fit_agents:two_dimension_agent", TASKS, VAL_TASKS)
    assert list(summary.val_reward_by_version) == [0] and summary.extra["best"]["version"] == 0
    assert summary.rollouts == len(VAL_TASKS)  # no training rollout
    ws = summary.extra["warm_start"]
    assert ws["source"] == first.run_id and 0 < ws["trajectories"] <= len(TASKS) * 2 and ws["tasks"] == len(TASKS)
    assert ws["steps"] >= 1 and ws["first_loss"] is not None
    dsn = Settings(data_dir=Path(summary.data_dir)).resolved_clickhouse_dsn
    listed = {r.run_id: r for r in list_runs(lambda sql: clickhouse.query(dsn, sql),
                                             run_records(Path(summary.data_dir)))}
    assert listed[str(summary.run_id)].warm_start == {"source": first.run_id, "trajectories": ws["trajectories"],
                                                      "tasks": len(TASKS)}  # the runs' lineage
    run_dir = Path(summary.data_dir)
    start = load_file(str(run_dir / "checkpoints" / str(summary.run_id) / "v0" / "model.safetensors"))
    tuned = load_file(str(Path(ws["checkpoint"]) / "model.safetensors"))
    base = load_file(str(run_dir / "checkpoints" / first.run_id / "v0" / "model.safetensors"))
    assert all(start[k].equal(tuned[k]) for k in tuned)  # the run began from the fine-tuned weights
    assert any(not tuned[k].equal(base[k]) for k in tuned)  # which moved from the policy's own


@pytest.mark.timeout(900)
def test_a_run_without_learning_signal_says_so_and_the_summary_records_it(tmp_path: Path) -> None:
    # two waves of one group each go out on version 0: two windows, both flat
    algorithm = GRPO(group_size=2, groups_per_step=1, passes=1, val_every=0, window_seconds=None, max_versions=1,
                     signal_windows=2)
    summary = Trainer(algorithm=algorithm, n_runners=1, concurrency=4, settings=_settings(tmp_path),
                      quiet=True).fit("tests.fit_agents:zero_agent", TASKS[:2])
    line = summary.extra["no_signal"]
    assert line is not None and "every reward was 0" in line and "litstream rollout show ro-" in line
    assert all(w["flat"] == w["groups"] for w in summary.extra["windows"])
    assert summary.extra["stopped"].startswith("budget reached")


def test_dev_runs_each_task_once_with_baseline(joined: Callable[..., Trainer], shared_stack: Stack) -> None:
    trainer = joined("tests.fit_agents:copy_agent")
    summary = trainer.dev("tests.fit_agents:copy_agent", TASKS)
    assert summary.algorithm == "baseline"
    assert summary.rollouts == len(TASKS) and summary.failed == 0
    assert list(summary.train_reward_by_version) == [0]
    # Each fit that joins a stack is a run of its own in the stack's history, with its record there.
    again = trainer.dev("tests.fit_agents:copy_agent", TASKS[:1])
    assert summary.run_id and again.run_id and summary.run_id != again.run_id
    records = run_records(shared_stack.settings.data_dir)
    assert records[summary.run_id]["ended"] == records[again.run_id]["ended"] == "finished"


def test_a_baseline_validation_says_its_standard_error_and_each_dimension(joined: Callable[..., Trainer]) -> None:
    """Evaluating a policy on held-out tasks (``--algorithm baseline --val``) reports what GRPO's validations do."""
    summary = joined("tests.fit_agents:two_dimension_agent", algorithm=Baseline()).fit(
        "tests.fit_agents:two_dimension_agent", TASKS[:1], VAL_TASKS)
    v0 = summary.extra["validation"]["0"]
    assert (v0["tasks"], v0["samples"], v0["dimensions"]) == (len(VAL_TASKS), 1, {"one": {"mean": 1.0, "se": 0.0}})
    assert v0["mean"] == pytest.approx(summary.val_reward_by_version[0], abs=1e-4) and v0["se"] is not None


class BestOfTwoTemperatures(Algorithm):
    """A user's algorithm: publishes two sampling settings with the served policy, validates each, keeps the
    better one. Only the Driver interface is used."""

    name = "best-temperature"

    def run(self, driver: Driver, train: Sequence[Any], val: Sequence[Any] | None) -> None:
        policy = driver.latest_policy()
        assert policy is not None
        base = driver.resources(policy.resources_id)
        scores = {}
        for k, temperature in enumerate((1.0, 0.5)):
            llm = next(iter(base.values())).model_copy(update={"sampling_parameters": {"temperature": temperature}})
            rid = driver.publish({"main_llm": llm})
            results = run_all(driver, val or train, VAL, resources_id=rid)
            for r in results:
                self.history.add(r, k)
            scores[temperature] = sum(r.reward or 0 for r in results)
        self.best = max(scores, key=lambda t: scores[t])


def test_a_user_written_algorithm_needs_only_the_driver(joined: Callable[..., Trainer]) -> None:
    algorithm = BestOfTwoTemperatures()
    summary = joined("tests.fit_agents:copy_agent", algorithm=algorithm).fit(
        "tests.fit_agents:copy_agent", TASKS, VAL_TASKS)
    assert summary.rollouts == 2 * len(VAL_TASKS) and summary.failed == 0
    assert sorted(summary.val_reward_by_version) == [0, 1]
    assert algorithm.best in (1.0, 0.5)


class CancelWhatIsQueued(Algorithm):
    """Submits more rollouts than the runner's slot takes at once, then cancels them all: those still queued end
    cancelled, the one running finishes."""

    name = "cancel-queued"

    def run(self, driver: Driver, train: Sequence[Any], val: Sequence[Any] | None) -> None:
        ids = driver.submit([{"seconds": 3.0}] * 5, mode="train")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self._one_running(driver, ids):
            time.sleep(0.2)
        self.cancelled = driver.cancel(ids)
        while driver.outstanding():
            for r in driver.poll():
                self.history.add(r)
        # A version only the trainer published (no policy server fronts it) is not one agents can run with.
        driver.publish({POLICY_RESOURCE: LLM(endpoint="torch:///nowhere", model="tiny-policy", version=99)},
                       policy_resources_id(99))
        self.servable = (driver.servable(policy_resources_id(99)), driver.servable(policy_resources_id(98)))
        driver.serving_through_proxy = True  # type: ignore[attr-defined]  # as when this run starts the server
        self.servable_behind_server = driver.servable(policy_resources_id(99))

    @staticmethod
    def _one_running(driver: Driver, ids: list[str]) -> bool:
        snaps = driver.view.catch_up()  # type: ignore[attr-defined]
        return any(snaps.get(rid) is not None and snaps[rid].status == "running" for rid in ids)


def test_rollouts_no_runner_has_begun_are_cancelled(joined: Callable[..., Trainer]) -> None:
    algorithm = CancelWhatIsQueued()
    summary = joined("tests.fit_agents:slow_agent", algorithm=algorithm, concurrency=1).fit(
        "tests.fit_agents:slow_agent", [{"seconds": 3.0}])
    assert algorithm.cancelled == 4 and summary.by_status == {"succeeded": 1, "cancelled": 4}
    assert summary.train_reward_by_version == {0: 1.0}  # a cancelled rollout never ran: it has no reward
    # Joined, nothing tells this driver that a server publishes itself: a known version is servable, 98 is unknown;
    # behind its own policy server, a version the server never fronted is not.
    assert algorithm.servable == (True, False) and algorithm.servable_behind_server is False


def test_an_agent_that_raises_fails_its_rollouts_and_loses_nothing(joined: Callable[..., Trainer]) -> None:
    tasks = [{"letter": "a", "count": 1}, {"explode": True}, {"letter": "b", "count": 1}]
    summary = joined("tests.fit_agents:raising_agent", algorithm=Baseline()).fit(
        "tests.fit_agents:raising_agent", tasks)
    assert summary.rollouts == len(tasks)  # every task accounted for
    assert summary.failed == 1 and summary.by_status.get("succeeded") == 2


def test_bad_datasets_and_agents_are_refused_before_anything_starts(tmp_path: Path) -> None:
    trainer = Trainer(algorithm=Baseline(), settings=_settings(tmp_path), quiet=True)
    with pytest.raises(ValueError, match="task 1 cannot be sent"):
        trainer.fit("tests.fit_agents:copy_agent", [{"ok": 1}, {"bad": object()}])
    with pytest.raises(ValueError, match="sequence of tasks"):
        trainer.fit("tests.fit_agents:copy_agent", "not a list")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="module:attr"):
        trainer.fit("no_colon", TASKS)
    with pytest.raises(ValueError, match="cannot find the agent's module 'no_such_package.agent'"):
        trainer.fit("no_such_package.agent:run", TASKS)  # runners would crash on it until the supervisor gave up
    with pytest.raises(ValueError, match="module-level"):
        agent_path(lambda task, llm: 0.0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"letter": "a", "count": 1}\n{"letter": \n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not a JSON value"):
        load_dataset(bad)
    assert not (tmp_path / "data" / "train").exists()  # nothing was started


def test_a_run_is_refused_where_another_one_runs_and_leaves_its_files_alone(tmp_path: Path) -> None:
    from litstream.app.stack import StackLock, StackLockedError

    run_dir = tmp_path / "data" / "train"
    held = StackLock(run_dir)
    held.acquire()  # as the stack of a run going on there holds it
    (run_dir / "logs").mkdir()
    try:
        with pytest.raises(StackLockedError, match="a stack already runs"):
            Trainer(algorithm=Baseline(), settings=_settings(tmp_path), quiet=True).fit(
                "tests.fit_agents:copy_agent", TASKS)
    finally:
        held.release()
    assert (run_dir / "logs").is_dir() and not (run_dir / "run.json").exists()


def _train_cmd(*extra: str) -> list[str]:
    return [sys.executable, "-m", "litstream.app.cli", "train", "--agent", "tests.fit_agents:copy_agent",
            "--runners", "1", "--concurrency", "4", "--group-size", "2", "--groups-per-step", "2", "--json", *extra]


def test_a_learning_rate_that_would_wreck_a_pretrained_model_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    env = {**os.environ, "LITSTREAM_DATA_DIR": str(tmp_path / "data"), "COLUMNS": "200"}
    out = subprocess.run(_train_cmd("--train", "examples/data/copy_train.jsonl", "--model", "smollm2", "--lr", "1e-3"),
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "would wreck a pretrained model" in out.stderr and "the default is 1e-05" in out.stderr
    assert not (tmp_path / "data" / "train").exists()  # nothing was started


def test_datasets_load_from_jsonl_and_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(TASKS), tmp_path / "t.parquet")
    assert load_dataset(tmp_path / "t.parquet") == TASKS
    assert load_dataset(Path("examples/data/copy_val.jsonl"))[0] == {"letter": "b", "count": 1}


@pytest.mark.timeout(900)
def test_a_two_call_agent_gives_its_triplets_in_call_order(tmp_path: Path) -> None:
    from litstream.infra.kafka import read_to_end
    from litstream.schemas.codec import default_codec
    from litstream.schemas.events import TripletEmitted

    triplets: list[TripletEmitted] = []

    def read_triplets(settings: Settings) -> None:
        codec = default_codec(settings.schema_registry_url)
        deadline = time.monotonic() + 120
        while len(triplets) < 2 * len(TASKS) * 2 and time.monotonic() < deadline:
            triplets[:] = [codec.decode_as(m.value(), TripletEmitted)
                           for m in read_to_end(settings, f"{settings.topic_prefix}.triplets")]
            time.sleep(0.5)

    algorithm = GRPO(group_size=2, groups_per_step=len(TASKS), passes=1, max_versions=1, window_seconds=None)
    summary = Trainer(algorithm=algorithm, n_runners=1, settings=_settings(tmp_path), quiet=True,
                      on_finish=read_triplets).fit("tests.fit_agents:two_turn_agent", TASKS)
    assert summary.rollouts == len(TASKS) * 2 and summary.failed == 0
    by_attempt: dict[str, list[TripletEmitted]] = {}
    for t in triplets:
        by_attempt.setdefault(t.attempt_id, []).append(t)
    assert len(by_attempt) == len(TASKS) * 2
    for calls in by_attempt.values():
        calls.sort(key=lambda t: t.index)
        assert [t.index for t in calls] == [0, 1]
        # the second call's prompt holds the first exchange: it is the longer one
        assert len(calls[1].prompt_token_ids) > len(calls[0].prompt_token_ids)
        assert calls[1].reward is not None


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_openai_example_agent_learns_with_validation(tmp_path: Path) -> None:
    """examples/copy_agent.py through Trainer.fit: validation reward rises clearly (2 CPU cores, ~10 min)."""
    from examples.copy_agent import make_dataset

    algorithm = GRPO(group_size=8, groups_per_step=16, passes=40, val_every=10, lr=1e-3, ppo_epochs=4,
                     entropy_coef=0.03, max_staleness=2, minutes=9.0)
    summary = Trainer(algorithm=algorithm, n_runners=1, concurrency=64, settings=_settings(tmp_path),
                      quiet=True).fit("tests.fit_agents:copy_agent", make_dataset(64, 0), make_dataset(16, 1))
    val = summary.val_reward_by_version
    assert len(val) >= 2 and val[max(val)] > val[0] + 0.2, val


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_openai_example_agent_runs_with_smollm2(tmp_path: Path) -> None:
    algorithm = GRPO(model="smollm2", group_size=2, groups_per_step=2, passes=1, max_versions=1, val_every=1)
    summary = Trainer(algorithm=algorithm, n_runners=1, settings=_settings(tmp_path), quiet=True).fit(
        "tests.fit_agents:copy_agent", TASKS[:2], VAL_TASKS[:1])
    assert summary.failed == 0 and 0 in summary.val_reward_by_version


def _last_prompt_template(settings: Settings) -> str | None:
    """The prompt template of the newest publication on the resources topic (by creation time: the topic has
    several partitions, so arrival order is not publication order)."""
    from litstream.schemas.codec import default_codec
    from litstream.schemas.models import PromptTemplate
    from litstream.streams.views import ResourcesView

    view = ResourcesView(settings, default_codec(settings.schema_registry_url))
    try:
        assert view.caught_up(60.0)
        updates = sorted(view.state.by_id.values(), key=lambda u: u.create_time)
    finally:
        view.close()
    templates = [r for r in updates[-1].resources.values() if isinstance(r, PromptTemplate)] if updates else []
    return templates[0].template if templates else None


@pytest.mark.timeout(600)
def test_prompt_search_keeps_the_template_with_the_best_validation_reward_and_publishes_it_last(
        joined: Callable[..., Trainer]) -> None:
    from litstream.trainer.algorithm import PromptSearch, RolloutResult

    asked: list[tuple[str, float, int]] = []

    def critic(template: str, score: float, results: Sequence[RolloutResult]) -> str:
        asked.append((template, score, len(results)))
        if len(asked) > 1:
            raise ConnectionError("the critic's endpoint went away")  # the search still ends on what it has
        return template + "{letter}"  # the answer for counts up to 2

    last: list[str | None] = []
    algorithm = PromptSearch(["PLEASE ANSWER.", "LETTER {letter}"], critic=critic, rounds=2)
    summary = joined("tests.fit_agents:template_agent", algorithm=algorithm,
                     on_finish=lambda s: last.append(_last_prompt_template(s))).fit(
        "tests.fit_agents:template_agent", TASKS, VAL_TASKS)
    assert algorithm.scores == {"PLEASE ANSWER.": 0.0, "LETTER {letter}": 0.5, "LETTER {letter}{letter}": 1.0}
    # the critic saw the best template so far and its rollouts; its failure in round 2 is reported
    assert asked == [("LETTER {letter}", 0.5, len(VAL_TASKS)), ("LETTER {letter}{letter}", 1.0, len(VAL_TASKS))]
    assert algorithm.report()["critic_errors"] == ["ConnectionError: the critic's endpoint went away"]
    assert algorithm.best == "LETTER {letter}{letter}" and last == [algorithm.best]
    assert summary.val_reward_by_version == {0: 0.0, 1: 0.5, 2: 1.0}
    assert summary.train_reward_by_version == {3: 1.0}  # the training set ran with the best template
    assert summary.rollouts == 3 * len(VAL_TASKS) + len(TASKS) and summary.failed == 0


@pytest.mark.slow(enabled_by="LITSTREAM_LONG_RUNS")  # a minute or more; CI runs it (.ci/run)
@pytest.mark.timeout(600)
def test_litstream_train_runs_prompt_search_with_the_policy_endpoint_as_its_critic(tmp_path: Path) -> None:
    """`litstream train --algorithm prompt-search --critic-url policy`: the run's own policy server, over the
    OpenAI API (openai_critic), proposes a third template; whatever it wrote, it is scored like the others."""
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(t) + "\n" for t in VAL_TASKS))
    env = {**os.environ, "LITSTREAM_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "litstream.app.cli", "train", "--agent", "tests.fit_agents:template_agent",
           "--train", "examples/data/copy_val.jsonl", "--val", str(val), "--algorithm", "prompt-search",
           "--template", "PLEASE ANSWER.", "--template", "LETTER {letter}", "--critic-url", "policy",
           "--critic-max-tokens", "48", "--runners", "1", "--concurrency", "4", "--json"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    scores = out["template_scores"]
    assert out["algorithm"] == "prompt-search"
    assert scores["PLEASE ANSWER."] == 0.0 and scores["LETTER {letter}"] == 0.5
    [proposal] = out["proposals"]  # one round, and the critic answered
    assert out["critic_errors"] == []
    tried = proposal not in ("", "PLEASE ANSWER.", "LETTER {letter}")  # whatever the tiny policy wrote
    assert len(scores) == (3 if tried else 2) and (not tried or proposal in scores)
    assert out["best_template"] == max(scores, key=lambda t: scores[t])
    assert out["rollouts"] == len(scores) * len(VAL_TASKS) + len(load_dataset(Path("examples/data/copy_val.jsonl")))
