"""``Trainer``: the reference's training entry point, ``Trainer(algorithm=...).fit(agent, train, val)``.

It lives in the shell (``app/``) because it starts processes: the embedded broker and the pipeline (lifecycle,
span sink, triplet processor), the policy endpoint (publishing itself, so agents get a per-attempt OpenAI URL),
what the algorithm needs (the GRPO trainer) and ``n_runners`` runner processes with the agent. The algorithms
themselves are in ``litstream.trainer.algorithm`` and see all of this only through :class:`StackDriver`.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from litstream.infra import clickhouse, health
from litstream.infra.broker import free_port
from litstream.infra.producer import EventProducer
from litstream.infra.service import on_stop_signals
from litstream.infra.settings import Settings
from litstream.schemas.codec import Codec
from litstream.schemas.events import SpanRecorded
from litstream.schemas.models import (
    FINISHED,
    LLM,
    QUEUING,
    NamedResources,
    ProxyLLM,
    RolloutConfig,
    new_run_id,
)
from litstream.schemas.policy_versions import POLICY_RESOURCE, parse_policy_version, policy_resources_id
from litstream.streams.span_attrs import reward_dimension_values, reward_value
from litstream.streams.stateview import StateView
from litstream.streams.views import ResourcesView, TopicFollower
from litstream.trainer.algorithm import (
    GRPO,
    Algorithm,
    Baseline,
    History,
    Policy,
    RolloutResult,
    wait_for_policy,
)
from litstream.workers.client import cancel_rollout, enqueue_rollout
from litstream.workers.runs import RUN_FILE, RUNS_DIR

from . import roles
from .roles import Role
from .stack import Stack, StackLock

# A runner that dies mid-attempt stops its heartbeats (every 5 s): the attempt goes unresponsive after this
# long and the rollout gets another attempt. An agent that raises fails its attempt, which is not retried.
DEFAULT_ROLLOUT_CONFIG = RolloutConfig(unresponsive_seconds=30.0, max_attempts=3,
                                       retry_condition=["unresponsive", "timeout"])
REWARD_GRACE_S = 5.0  # a finished rollout's reward span may reach the spans topic just after its status


class RewardsView(TopicFollower):
    """Final reward of each rollout, from the reward spans on the spans topic (the last one wins)."""

    record_type = SpanRecorded

    def __init__(self, settings: Settings, codec: Codec) -> None:
        self.rewards: dict[str, float] = {}
        self.dimensions: dict[str, dict[str, float]] = {}  # a reward's other named dimensions (not the primary)
        self.resources_ids: dict[str, str] = {}  # the resources the attempt that emitted the reward ran with
        super().__init__(settings, f"{settings.topic_prefix}.spans", codec)

    def on_record(self, span: SpanRecorded) -> None:
        value = reward_value(span.name, span.attributes)
        if value is not None:
            self.rewards[span.meta.rollout_id] = value
            self.dimensions[span.meta.rollout_id] = dict(list(reward_dimension_values(span.attributes).items())[1:])
            if span.resources_id:
                self.resources_ids[span.meta.rollout_id] = span.resources_id


@dataclass
class _Pending:
    mode: str
    resources_id: str | None
    data_id: str | None
    finished_at: float | None = None
    status: str | None = None


class StackDriver:
    """The :class:`~litstream.trainer.algorithm.Driver` over a running stack (embedded or joined)."""

    def __init__(self, settings: Settings, stack: Stack | None, console: Console,
                 rollout_config: RolloutConfig | None = None) -> None:
        self.settings = settings
        self.rollout_config = rollout_config
        self.stack = stack
        self.console = console
        self.events = EventProducer(settings, role="trainer-driver")
        self.view = StateView(settings, self.events.codec)
        self.resources_view = ResourcesView(settings, self.events.codec)
        self.rewards = RewardsView(settings, self.events.codec)
        self.pending: dict[str, _Pending] = {}
        self.stop_event = threading.Event()
        self.serving_through_proxy = False  # True once a policy server publishes itself
        # The URL agents get from this stack's policy server: a resumed run's log also holds the proxies of the
        # server its earlier part ran, whose URL is gone.
        self.server_endpoint: str | None = None
        self.gateway_url: str | None = None  # where Agent Lightning's own runners reach this stack
        self.adopted: list[str] = []  # rollouts the earlier part of a resumed run left unfinished
        self._last_show = 0.0

    def close(self) -> None:
        self.events.flush()
        self.events.close()
        for view in (self.view, self.resources_view, self.rewards):
            view.close()

    # --- rollouts -------------------------------------------------------------------------------------------

    def submit(self, tasks: Sequence[Any], *, mode: str, resources_id: str | None = None,
               metadata: Sequence[dict[str, Any]] | None = None) -> list[str]:
        ids = []
        for i, task in enumerate(tasks):
            meta = dict(metadata[i]) if metadata else {}
            ev = enqueue_rollout(self.events, task, mode=mode, resources_id=resources_id,  # type: ignore[arg-type]
                                 metadata=meta, config=self.rollout_config)
            self.pending[ev.rollout_id] = _Pending(mode, resources_id, meta.get("data_id"))
            ids.append(ev.rollout_id)
        self.events.flush()
        return ids

    def outstanding(self) -> int:
        return len(self.pending)

    def cancel(self, rollout_ids: Sequence[str]) -> int:
        return self._cancel_queued([rid for rid in rollout_ids if rid in self.pending])

    def _cancel_queued(self, rollout_ids: Sequence[str]) -> int:
        snaps = self.view.catch_up()
        queued = [rid for rid in rollout_ids if (snap := snaps.get(rid)) is not None and snap.status in QUEUING]
        for rid in queued:
            cancel_rollout(self.events, rid)
        self.events.flush()
        return len(queued)

    # --- what the earlier part of a resumed run left ----------------------------------------------------------

    def adopt_unfinished(self) -> int:
        """Take on the rollouts the run's log holds unfinished (queued or running when its earlier part stopped):
        runners claim them, and those whose runner died are retried once their attempt goes unresponsive, as any
        other; ``settle_adopted`` accounts for them at the end."""
        self.adopted = [rid for rid, snap in self.view.catch_up().items() if snap.status not in FINISHED]
        return len(self.adopted)

    def settle_adopted(self, wait_s: float) -> dict[str, int]:
        """At the end of a resumed run: the adopted rollouts no runner has begun are cancelled, those running get
        up to ``wait_s`` to finish; their statuses, counted."""
        if not self.adopted:
            return {}
        self._cancel_queued(self.adopted)
        deadline = time.monotonic() + wait_s
        while True:
            snaps = self.view.catch_up()
            statuses = Counter(snaps[rid].status if rid in snaps else "unknown" for rid in self.adopted)
            if set(statuses) <= FINISHED or time.monotonic() >= deadline or self.stop_event.is_set():
                return dict(statuses)
            time.sleep(0.5)

    def log_statuses(self) -> dict[str, int]:
        """Every rollout of this stack's log, by status: a run's own topics hold only its rollouts."""
        return dict(Counter(snap.status for snap in self.view.catch_up().values()))

    def poll(self, timeout: float = 0.5) -> list[RolloutResult]:
        time.sleep(min(timeout, 0.2))
        snaps = self.view.catch_up()
        now = time.monotonic()
        done: list[RolloutResult] = []
        for rid, p in list(self.pending.items()):
            snap = snaps.get(rid)
            if p.finished_at is None and snap is not None and snap.status in FINISHED:
                p.finished_at, p.status = now, snap.status
            if p.finished_at is None:
                continue
            reward = self.rewards.rewards.get(rid)
            if reward is None and p.status == "succeeded" and now - p.finished_at < REWARD_GRACE_S:
                continue
            used = p.resources_id or self.rewards.resources_ids.get(rid)
            done.append(RolloutResult(rid, p.mode, str(p.status), reward, parse_policy_version(used), used,
                                      p.data_id, self.rewards.dimensions.get(rid, {})))
            del self.pending[rid]
        return done

    # --- resources ------------------------------------------------------------------------------------------

    def publish(self, resources: NamedResources, resources_id: str | None = None) -> str:
        import uuid

        from litstream.schemas.events import ResourcesPublished
        from litstream.streams.resources import to_records

        rid = resources_id or f"rs-{uuid.uuid4().hex[:12]}"
        now = time.time()
        self.events.send(self.events.topics.resources, ResourcesPublished(
            **self.events.factory.stamp(), resources_id=rid, version=1, create_time=now, update_time=now,
            resources=to_records(resources)))
        self.events.flush()
        self.resources_view.wait_for(lambda: True if rid in self.resources_view.state.by_id else None, 30.0)
        return rid

    def resources(self, resources_id: str) -> NamedResources:
        update = self.resources_view.state.by_id.get(resources_id)
        return dict(update.resources) if update else {}

    def servable(self, resources_id: str) -> bool:
        update = self.resources_view.state.by_id.get(resources_id)
        if update is None:
            return False
        return not self.serving_through_proxy or any(
            isinstance(r, ProxyLLM) and (self.server_endpoint is None or r.endpoint == self.server_endpoint)
            for r in update.resources.values())

    def front_newest_policy(self) -> None:
        """A resumed run's newest policy version, published again as its trainer published it (the proxy of the
        server its earlier part ran is gone with that server), so this stack's policy server fronts it."""
        from litstream.workers.policy_server.versions import WEIGHTS_RESOURCE, policy_llm

        versions = [(v, rid) for rid in list(self.resources_view.state.by_id)
                    if (v := parse_policy_version(rid)) is not None]
        if not versions or self.servable(max(versions)[1]):
            return
        rid = max(versions)[1]
        update = self.resources_view.state.by_id[rid]
        llm = policy_llm(update)
        if llm is None:
            return
        others = {k: r for k, r in update.resources.items() if k not in (POLICY_RESOURCE, WEIGHTS_RESOURCE)}
        self.publish({POLICY_RESOURCE: llm, **others}, rid)

    def latest_policy(self) -> Policy | None:
        """The newest ``policy-vN`` publication, once it is served to agents (a ProxyLLM when a policy server
        publishes itself: the trainer's own ``torch://`` publication is not usable by an OpenAI client)."""
        best: Policy | None = None
        for rid in list(self.resources_view.state.by_id):
            version = parse_policy_version(rid)
            if version is None or (best is not None and version <= best.version):
                continue
            if self.servable(rid):
                best = Policy(version, rid)
        return best

    # --- processes ------------------------------------------------------------------------------------------

    def start_service(self, name: str, *args: str) -> None:
        if self.stack is None:
            raise RuntimeError(f"joined a running stack: start `litstream {' '.join(args)}` there yourself")
        self.stack.start(name, *args)

    def service_info(self, name: str) -> dict[str, Any]:
        role = {"trainer": "trainer"}.get(name, name)
        return health.read(self.settings.data_dir, role) or {}

    def stopping(self) -> bool:
        if self.stack is not None:
            self._retire_finished()
            if self.serving_through_proxy:  # a restarted policy server may listen elsewhere
                self.server_endpoint = self.policy_server_endpoint() or self.server_endpoint
            for line in self.stack.supervise():  # a crashed runner is restarted; its claims are retried
                self.console.print(f"  [yellow]supervisor:[/] {line}")
        return self.stop_event.is_set()

    def policy_server_endpoint(self) -> str | None:
        """The URL this stack's policy server publishes (its health beat says it)."""
        return (health.read(self.settings.data_dir, "policy-server") or {}).get("endpoint")

    def _retire_finished(self) -> None:
        """A service that stopped by itself with code 0 (the trainer after --max-steps) is done, not crashed:
        take it out of the supervisor's hands so it is not restarted."""
        assert self.stack is not None
        for name, child in list(self.stack.children.items()):
            if name == "trainer" and child.proc.proc.poll() == 0:
                child.proc.stop()
                del self.stack.children[name]

    def show(self, message: str) -> None:
        if time.monotonic() - self._last_show >= 5.0:
            self.console.print(f"  {message}")
            self._last_show = time.monotonic()

    def trajectories(self, run: str) -> tuple[str, list[dict[str, Any]]]:
        from litstream.trainer import export
        from litstream.workers import runs

        dsn = self.settings.resolved_clickhouse_dsn
        with clickhouse.reader(dsn, may_open=False, wait_s=120.0) as query:  # the stack's span sink owns chDB
            run_id = runs.run_named(query, self.settings.data_dir, run).run_id
        triplets, modes = export.read_triplets(dsn, run_id=run_id, may_open=False, wait_s=120.0)
        return run_id, export.trajectory_records(triplets, modes, run=run_id)

    def work_dir(self) -> Path:
        path = self.settings.data_dir / "checkpoints" / (self.settings.run_id or "") / "work"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def notice(self, message: str) -> None:
        """A line the user must see, printed whenever it comes (progress lines are thinned to one per 5 s)."""
        self.console.print(f"  [bold]{message}[/]")


def outcome_lines(extra: dict[str, Any]) -> list[str]:
    """What a run's summary says beyond its table (rich markup, values escaped): the best validated version and
    where it was published, why the run stopped, and the verdict when it had no learning signal."""
    from rich.markup import escape

    lines = []
    warm = extra.get("warm_start")
    if warm:
        lines.append(f"warm start: v0 fine-tuned on {warm['trajectories']} trajectories of "
                     f"{escape(str(warm['source']))} ({warm['tasks']} tasks) in {warm['seconds']:.0f}s")
    best = extra.get("best")
    if best:
        lines.append(f"best validated version: v{best['version']} ({best['validation']:.3f}), published as "
                     f"{escape(str(best.get('resources_id') or '(not published: stopped)'))}; checkpoint "
                     f"{escape(str(best.get('checkpoint')))}")
    left = extra.get("left_unfinished")
    if left:
        lines.append("rollouts the run had left unfinished, now: "
                     + ", ".join(f"{status} {n}" for status, n in sorted(left.items())))
    for key in ("stopped", "no_signal"):
        if extra.get(key):
            lines.append(f"{key.replace('_', ' ')}: {escape(str(extra[key]))}")
    return lines


@dataclass
class FitSummary:
    algorithm: str
    train_reward_by_version: dict[int, float]
    val_reward_by_version: dict[int, float]
    rollouts: int
    failed: int
    by_status: dict[str, int]
    seconds: float
    interrupted: bool
    data_dir: str
    run_id: str | None = None  # every rollout-scoped event of the run carries it (docs/history.md)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def versions(self) -> list[int]:
        return sorted(set(self.train_reward_by_version) | set(self.val_reward_by_version))

    def as_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "versions": self.versions,
                "train_reward_by_version": {str(v): round(r, 4) for v, r in self.train_reward_by_version.items()},
                "val_reward_by_version": {str(v): round(r, 4) for v, r in self.val_reward_by_version.items()},
                "rollouts": self.rollouts, "failed": self.failed, "by_status": self.by_status,
                "seconds": round(self.seconds, 1), "interrupted": self.interrupted, "data_dir": self.data_dir,
                "run_id": self.run_id, **self.extra}


def agent_path(agent: Any) -> tuple[str, str | None]:
    """``module:attr`` by which a runner process imports ``agent``, and a directory to put on its path (for an
    agent defined in the script being run)."""
    if isinstance(agent, str):
        if ":" not in agent:
            raise ValueError(f"agent {agent!r}: give it as module:attr, e.g. examples.copy_agent:copy_agent")
        return agent, None
    module_name = getattr(agent, "__module__", None) or type(agent).__module__
    module = sys.modules.get(module_name)
    if module is None:
        raise ValueError(f"cannot tell where agent {agent!r} is defined: give it as 'module:attr'")
    attr = next((name for name, value in vars(module).items() if value is agent), None)
    if attr is None:
        raise ValueError(f"agent {agent!r} is not a module-level name of {module_name}: runners import it by "
                         "name, so define it at module level (or give 'module:attr')")
    extra_path = None
    if module_name == "__main__":
        file = Path(inspect.getfile(module)).resolve()
        module_name, extra_path = file.stem, str(file.parent)
    return f"{module_name}:{attr}", extra_path


def check_importable(path: str, extra_path: str | None = None) -> None:
    """Fail before the stack starts when runners could not import the agent: they run ``python -m`` in this
    directory (so it is on their path, with ``extra_path``), and would otherwise crash until the supervisor gives
    up."""
    module_name, _, attr = path.partition(":")
    added = [p for p in (extra_path, os.getcwd()) if p and p not in sys.path]
    sys.path[:0] = added
    try:
        found = importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        for p in added:
            sys.path.remove(p)
    if not found:
        raise ValueError(f"cannot find the agent's module {module_name!r} (from {path!r}) in {os.getcwd()} or on "
                         "PYTHONPATH: runners import it by name, so run from the directory that holds it or add "
                         "that directory to PYTHONPATH")
    if not attr:
        raise ValueError(f"agent {path!r}: give it as module:attr, e.g. examples.copy_agent:copy_agent")


def load_dataset(path: Path) -> list[Any]:
    """Tasks from a JSONL file (one JSON value a line) or a Parquet file (one dict a row)."""
    if not path.exists():
        raise ValueError(f"dataset {path} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_table(path).to_pylist())
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            tasks.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not a JSON value ({exc.msg}); each line of a JSONL dataset is one "
                             "task, e.g. {\"letter\": \"c\", \"count\": 2}") from None
    return tasks


class Trainer:
    """``Trainer(algorithm=GRPO(), n_runners=2).fit(agent, train_dataset, val_dataset)``.

    ``agent``: a LitAgent, an ``@litagent`` function or a function taking ``task`` and ``llm`` (defined at
    module level: runner processes import it by name), or its ``"module:attr"``. A dataset is any sequence of
    JSON-able tasks. Without ``join``, everything runs on a fresh embedded stack in ``<data dir>/train``; with
    ``join=True`` the Kafka (and data dir) of the settings are used and only the driver runs here: start
    runners with ``litstream runner --agent module:attr`` on any machine that reaches that Kafka.

    ``gateway=True`` also serves the HTTP gateway (Agent Lightning's store API and OTLP) on ``gateway_port`` (0:
    any free port), so Agent Lightning's stock runners, pointed at the URL it prints, run the rollouts; with
    ``n_runners=0`` they are the only runners and ``agent`` may be None.
    """

    def __init__(self, algorithm: Algorithm | None = None, n_runners: int = 1, concurrency: int = 4,
                 model: str = "tiny", settings: Settings | None = None, join: bool = False,
                 quiet: bool = False, resume: bool = False, serve_policy: bool = True, run_name: str = "train",
                 on_finish: Callable[[Settings], None] | None = None,
                 rollout_config: RolloutConfig | None = None, gateway: bool = False,
                 gateway_port: int = 0) -> None:
        self.algorithm = algorithm or GRPO(model=model)
        self.n_runners = n_runners
        self.concurrency = concurrency
        self.model = getattr(self.algorithm, "model", model)
        self.settings = settings or Settings()
        self.join = join
        self.run_id: str | None = settings.run_id if settings is not None else None  # set when fit starts a stack
        self._given_run_id = self.run_id  # joined runs get a new id per fit unless the settings name one
        self._run_file: Path | None = None  # the run's record: its id, name, start and how it ended
        self._log_account: dict[str, dict[str, int]] = {}  # the run's rollouts by status, at its end
        self.resume = resume  # keep the checkpoints of the last run: the GRPO trainer goes on from its newest
        # False: no policy server; agents use the trainer's own publications (torch:// weights, in-process)
        self.serve_policy = serve_policy
        self.run_name = run_name  # the embedded stack's data dir: <data dir>/<run_name>
        self.on_finish = on_finish  # called with the stack's settings after training, while it still runs
        self.rollout_config = rollout_config or DEFAULT_ROLLOUT_CONFIG  # retries of every rollout it submits
        if gateway and join:  # a joined stack runs its own processes, its gateway among them
            raise ValueError("gateway=True starts a gateway on the embedded stack; with join, run "
                             "`litstream gateway` there")
        self.gateway = gateway
        self.gateway_port = gateway_port
        self.console = Console(stderr=True, quiet=quiet)
        self._driver: StackDriver | None = None
        self._stop = threading.Event()  # set by Ctrl-C or stop(); each fit starts with a fresh one
        self._stopping_announced = False

    def fit(self, agent: Any, train_dataset: Sequence[Any], val_dataset: Sequence[Any] | None = None) -> FitSummary:
        """Train ``agent`` on ``train_dataset``, validating on ``val_dataset``. Ctrl-C (or SIGTERM) at any point
        (while the stack starts, trains or stops) stops cleanly: no more rollouts are submitted, every process the run started
        is stopped, the trainer's checkpoints and the topics keep what was done, and the summary is returned."""
        train, val = _tasks(train_dataset, "train"), _tasks(val_dataset, "val") if val_dataset is not None else None
        path, extra_path = self._agent(agent)
        t0 = time.monotonic()
        self._stop = threading.Event()
        self._stopping_announced = False
        self._run_file = None
        self._log_account = {}
        try:
            with on_stop_signals(self._interrupt), self._running(path, extra_path) as driver:  # Ctrl-C, `kill`
                resumed = self.resume and not self.join
                if resumed and driver.adopt_unfinished():
                    self.console.print(f"  resuming: {len(driver.adopted)} rollout(s) the run left unfinished are "
                                       "taken on (claimed, or retried where their runner died)")
                self.algorithm.run(driver, train, val)
                if not self._stop.is_set() and not self.join:
                    # the rollouts it took on that still run get the time of one attempt gone unresponsive, and more
                    wait_s = 2 * (self.rollout_config.unresponsive_seconds or 30.0) + 60.0
                    self._log_account = {"left_unfinished": driver.settle_adopted(wait_s)} if resumed else {}
                    self._log_account["log_statuses"] = driver.log_statuses()
                if self.on_finish is not None and not self._stop.is_set():
                    self.on_finish(driver.settings)
        except _StoppedWhileStarting:
            pass
        except Exception as exc:
            if not self._stop.is_set():
                _record_end(self._run_file, "failed")
                raise
            # asked to stop: what the stop cut short (a wait for a policy, a timeout) is no error of the run
            self.console.print(f"  [dim]cut short by the stop: {type(exc).__name__}: {exc}[/]")
        _record_end(self._run_file, "stopped" if self._stop.is_set() else "finished")
        return self._summary(time.monotonic() - t0, self._stop.is_set())

    def _agent(self, agent: Any) -> tuple[str, str | None]:
        if agent is None and self.n_runners == 0 and self.gateway:
            return "(Agent Lightning runners through the gateway)", None
        if agent is None:
            raise ValueError("no agent: give one for the runners (or n_runners=0 and gateway=True, and run "
                             "Agent Lightning's runners against the gateway)")
        path, extra_path = agent_path(agent)
        if self.n_runners > 0:
            check_importable(path, extra_path)
        return path, extra_path

    def dev(self, agent: Any, dataset: Sequence[Any]) -> FitSummary:
        """Run each task once with the current resources and no training (the reference's ``dev``)."""
        algorithm, self.algorithm = self.algorithm, Baseline()
        try:
            return self.fit(agent, dataset)
        finally:
            self.algorithm = algorithm

    def stop(self) -> None:
        """Ask a running ``fit`` to stop (what Ctrl-C does)."""
        self._stop.set()

    def _interrupt(self) -> None:
        """SIGINT / SIGTERM: only sets the stop flag (never raises), so the stack's processes are always stopped."""
        if self._stopping_announced:
            self.console.print("  already stopping: the stack's processes are being stopped ...")
        else:
            self.console.print("  stopping: the rollouts in flight are left to the log, checkpoints are kept; "
                               "stopping the stack's processes ...")
        self._stopping_announced = True
        self._stop.set()

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise _StoppedWhileStarting

    def _wait_ready(self, stack: Stack, role: Role) -> None:
        """``stack.wait_for`` that gives up as soon as the user asks to stop."""
        deadline = time.monotonic() + role.ready_timeout_s
        while True:
            self._check_stop()
            try:
                stack.wait_for(role, timeout=min(1.0, max(0.05, deadline - time.monotonic())))
                return
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise

    @contextmanager
    def _running(self, agent: str, extra_path: str | None) -> Iterator[StackDriver]:
        if self.join:
            # Each joined fit is a run of its own in the stack's history (unless the settings name one).
            self.run_id = self._given_run_id or new_run_id()
            self.settings = self.settings.model_copy(update={"run_id": self.run_id})
            self._run_file = self.settings.data_dir / RUNS_DIR / f"{self.run_id}.json"
            _write_run_record(self._run_file, self.run_id, self.run_name)
            driver = StackDriver(self.settings, None, self.console, self.rollout_config)
            driver.stop_event = self._stop
            self._driver = driver
            try:
                # what the stack published before (its policy) is known before the algorithm asks for it
                if not driver.resources_view.caught_up(60.0):
                    raise TimeoutError(f"could not read the resources topic of {self.settings.bootstrap_servers}")
                yield driver
            finally:
                driver.close()
            return
        run_dir = self.settings.data_dir / self.run_name
        _check_not_running(run_dir)  # a run going on there keeps its files: this one is refused, not the other
        # The history (the broker's log, ClickHouse, the runs' records and checkpoints) outlives a run; what only
        # the running stack uses starts afresh, but for a resumed run's own state.
        _clear_run_dir(run_dir, keep=[*KEPT_ACROSS_RUNS, *(KEPT_ON_RESUME if self.resume else [])])
        self.run_id = _run_id(run_dir, self.resume)
        self._run_file = run_dir / RUNS_DIR / f"{self.run_id}.json"
        update: dict[str, object] = {"data_dir": run_dir, "clickhouse_dsn": None, "run_id": self.run_id,
                                     "topic_prefix": run_topic_prefix(self.settings.topic_prefix, self.run_id)}
        _update_record(self._run_file, topic_prefix=update["topic_prefix"])  # where its log is, to look at it
        self._check_stop()
        with Stack(self.settings.model_copy(update=update)) as stack:
            settings_text = getattr(self.algorithm, "settings_text", None)
            self.console.print(f"[bold]litstream train[/]: {self.algorithm.name}, {self.n_runners} runner(s) x "
                               f"{self.concurrency} slots, agent {agent}; data in {run_dir}"
                               + (f"\n  {settings_text()}" if callable(settings_text) else ""))
            stack.start_broker()
            self._check_stop()
            stack.create_topics()
            self._check_stop()
            self.settings = stack.settings
            driver = StackDriver(stack.settings, stack, self.console, self.rollout_config)
            driver.stop_event = self._stop
            self._driver = driver
            try:
                self._start_pipeline(stack, driver, agent, extra_path)
                yield driver
            finally:
                driver.close()

    def _start_pipeline(self, stack: Stack, driver: StackDriver, agent: str, extra_path: str | None) -> None:
        """The stack's roles (roles.py) in its order: the pipeline, the triplet processor and what the algorithm
        starts (the trainer), the policy server and the gateway, then the runners."""
        pipeline = [*roles.PIPELINE, *([roles.TRIPLETS] if self.algorithm.uses_triplets else [])]
        for role in pipeline:
            stack.start_role(role)
        self.algorithm.prepare(driver)
        warm = self.algorithm.report().get("warm_start")
        if warm:  # the run's lineage: what its first version was fine-tuned on
            _update_record(self._run_file, warm_start={k: warm[k] for k in ("source", "trajectories", "tasks")})
        for role in roles.PIPELINE:
            self._wait_ready(stack, role)
        if self.algorithm.trains_policy:
            self._wait_ready(stack, roles.trainer())  # the algorithm started it, with its options
        if self.serve_policy:
            self._start_policy_server(stack, driver)
            if self.resume:
                driver.front_newest_policy()
        if self.gateway:
            self._start_gateway(stack, driver)
        if not self.algorithm.trains_policy and driver.latest_policy() is None:
            # Nothing trains: version 0 is the server's own policy, published for it to front.
            driver.publish({POLICY_RESOURCE: LLM(endpoint=f"{self.model}://initial", model=f"{self.model}-policy",
                                                 version=0)}, policy_resources_id(0))
        if extra_path:
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, os.environ.get("PYTHONPATH")) if p)
        for i in range(self.n_runners):
            self._check_stop()
            stack.start_role(roles.runner(agent, self.concurrency, name=f"runner-{i}"))
        wait_for_policy(driver, lambda p: True, 120.0)  # the server fronts version 0: agents can call it
        self._check_stop()
        self.console.print("  pipeline, policy server and runners are up")

    def _start_policy_server(self, stack: Stack, driver: StackDriver) -> None:
        """The policy endpoint on any free port, publishing itself: agents get a per-attempt OpenAI URL."""
        checkpoint = _published_checkpoint(driver) if self.algorithm.trains_policy else None
        source = ["--checkpoint", checkpoint] if checkpoint else ["--model", self.model]
        if checkpoint is None and Path(self.model).is_dir():  # a model directory, served as it is: this run's v0
            source = ["--checkpoint", self.model, "--as-version", "0"]
        server = roles.policy_server("--port", "0", "--publish", *source)
        driver.serving_through_proxy = True
        stack.start_role(server)
        self._wait_ready(stack, server)
        driver.server_endpoint = driver.policy_server_endpoint()

    def _start_gateway(self, stack: Stack, driver: StackDriver) -> None:
        """The gateway on a port fixed for the whole run (a restarted gateway keeps the URL runners were given)."""
        host, port = self.settings.gateway_host, self.gateway_port or free_port()
        gateway = roles.gateway(host, port)
        stack.start_role(gateway)
        self._wait_ready(stack, gateway)
        driver.gateway_url = f"http://{host}:{port}"
        stack.describe(gateway_url=driver.gateway_url)  # `litstream status` in this data dir shows it
        self.console.print(f"  [bold]gateway[/] on {driver.gateway_url}: point Agent Lightning's runners at it "
                           f"(AGL_CURRENT_ROLE=runner AGL_SERVER_HOST={host} AGL_SERVER_PORT={port})")

    def _summary(self, seconds: float, interrupted: bool) -> FitSummary:
        h: History = self.algorithm.history
        extra = self.algorithm.report()
        if self._driver is not None and self.gateway:
            extra["gateway_url"] = self._driver.gateway_url
        extra.update(self._log_account)  # an embedded run's every rollout, and what a resumed run took on
        return FitSummary(algorithm=self.algorithm.name, train_reward_by_version=History.means(h.train),
                          val_reward_by_version=History.means(h.val), rollouts=h.rollouts, failed=h.failed,
                          by_status=dict(h.statuses), seconds=seconds, interrupted=interrupted,
                          data_dir=str(self.settings.data_dir), run_id=self.run_id, extra=extra)


class _StoppedWhileStarting(Exception):
    """Ctrl-C came while the stack was starting: unwind (stopping what started) and return the summary."""


# What a new run in a data dir keeps of the runs before it: their log (each run's topics, under a prefix of its
# own), ClickHouse, their records and checkpoints; a resumed run also keeps its lifecycle table and trainer metrics.
KEPT_ACROSS_RUNS = ("kafka", "chdb", RUNS_DIR, "checkpoints", RUN_FILE, "stack.lock")
KEPT_ON_RESUME = ("faust", "trainer-metrics.jsonl")


def _check_not_running(run_dir: Path) -> None:
    """Raise StackLockedError (naming the holder) when a stack runs in ``run_dir``."""
    probe = StackLock(run_dir)
    probe.acquire()
    probe.release()


def run_topic_prefix(prefix: str, run_id: str) -> str:
    """The topics of one run of an embedded stack: ``<prefix>.<run id>.rollout-events`` and so on."""
    return f"{prefix}.{run_id}"


def _run_id(run_dir: Path, resume: bool) -> str:
    """The run's id: a new one, or with ``resume`` the newest run's (``run.json`` names it); the run's record is
    ``runs/<run id>.json``."""
    latest = run_dir / RUN_FILE
    if resume and latest.exists():
        try:
            run_id = str(json.loads(latest.read_text())["run_id"])
        except (ValueError, KeyError, TypeError):
            run_id = ""  # unreadable: the resumed weights go on under a new id
        if run_id:
            _write_run_record(run_dir / RUNS_DIR / f"{run_id}.json", run_id, run_dir.name, resumed=True)
            return run_id
    run_id = new_run_id()
    latest.parent.mkdir(parents=True, exist_ok=True)
    latest.write_text(json.dumps({"run_id": run_id, "name": run_dir.name}) + "\n")
    _write_run_record(run_dir / RUNS_DIR / f"{run_id}.json", run_id, run_dir.name)
    return run_id


def _write_run_record(path: Path, run_id: str, name: str, resumed: bool = False) -> None:
    """A run's record: its id, name, start and process (a resumed run keeps its start and has no end yet)."""
    record: dict[str, Any] = {}
    if resumed:
        try:
            record = {k: v for k, v in json.loads(path.read_text()).items() if k not in ("ended", "ended_at")}
        except (OSError, ValueError):
            record = {}
    record = {"run_id": run_id, "name": name, "started": time.time(), **record, "pid": os.getpid()}
    if resumed:
        record["resumed"] = time.time()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record) + "\n")


def _record_end(path: Path | None, how: str) -> None:
    """How the run ended (finished, stopped, failed), in its record; a killed run leaves none."""
    _update_record(path, ended=how, ended_at=time.time())


def _update_record(path: Path | None, **fields: Any) -> None:
    if path is None or not path.exists():
        return
    try:
        path.write_text(json.dumps({**json.loads(path.read_text()), **fields}) + "\n")
    except (OSError, ValueError):
        pass  # the record is a convenience: the run's history is the log


def _clear_run_dir(run_dir: Path, keep: list[str]) -> None:
    """Each run starts from an empty data dir and broker log, but for what ``keep`` names (to resume)."""
    import shutil

    if not run_dir.exists():
        return
    for child in run_dir.iterdir():
        if child.name in keep:
            continue
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _published_checkpoint(driver: StackDriver) -> str | None:
    update = driver.resources_view.wait_for(lambda: driver.resources_view.state.latest, 60.0)
    for res in (update.resources.values() if update else []):
        checkpoint = getattr(res, "checkpoint", None)
        if checkpoint:
            return str(checkpoint)
    return None


def _tasks(dataset: Sequence[Any] | None, name: str) -> list[Any]:
    """The dataset as a list, each task checked to be JSON-able (it travels in Kafka events)."""
    if dataset is None or isinstance(dataset, (str, bytes)) or not hasattr(dataset, "__len__"):
        raise ValueError(f"the {name} dataset must be a sequence of tasks (a list, a tuple, ...), not "
                         f"{type(dataset).__name__}")
    tasks = list(dataset)
    for i, task in enumerate(tasks):
        try:
            json.dumps(task)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} task {i} cannot be sent to runners ({exc}); tasks must be JSON values: "
                             "dicts, lists, strings, numbers") from None
    if not tasks and name == "train":
        raise ValueError("the train dataset is empty")
    return tasks
