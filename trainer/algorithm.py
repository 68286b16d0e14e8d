"""Training algorithms, as the reference's ``Algorithm``: they drive rollouts and publish resources.

An algorithm sees the running system only through a :class:`Driver` (implemented by ``litstream.app.trainer``
over Kafka: rollouts go through the rollout events and the lifecycle processor, rewards come back on the spans
topic, resources go to the resources topic). Nothing here knows about processes, the shell or the runners, so an
algorithm is pure of the stack and a user can write one (see ``docs/training.md``).

Three are provided:

* :class:`Baseline` runs every task once (mode ``train``) and every validation task once; nothing is trained.
* :class:`GRPO` starts the GRPO trainer process (triplets -> windows -> update -> ``policy-vN``) and feeds it
  ``group_size`` copies of each task, grouped by the task's data id, validating on version 0 and every
  ``val_every`` versions.
* :class:`PromptSearch` publishes prompt templates instead of weights (as the reference's APO): each candidate is
  scored by validation reward, a critic (any OpenAI-compatible endpoint) may propose new ones, the best is kept.
"""

from __future__ import annotations

import abc
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from litstream.schemas.models import NamedResources, PromptTemplate

TRAIN, VAL = "train", "val"


@dataclass(frozen=True)
class RolloutResult:
    """One finished rollout: its status, its final reward (None when it failed or emitted none) and the policy
    version (or resources id) it ran with."""

    rollout_id: str
    mode: str
    status: str
    reward: float | None
    version: int | None
    resources_id: str | None
    data_id: str | None = None


@dataclass(frozen=True)
class Policy:
    """A published policy the runners can use: its version and the resources id that carries it."""

    version: int
    resources_id: str


class Driver(Protocol):
    """What an algorithm can do with the running system."""

    def submit(self, tasks: Sequence[Any], *, mode: str, resources_id: str | None = None,
               metadata: Sequence[dict[str, Any]] | None = None) -> list[str]:
        """Enqueue one rollout per task; returns their rollout ids."""

    def poll(self, timeout: float = 0.5) -> list[RolloutResult]:
        """Rollouts that finished since the last call (waits up to ``timeout`` for the first)."""

    def outstanding(self) -> int:
        """Rollouts submitted and not yet returned by :meth:`poll`."""

    def publish(self, resources: NamedResources, resources_id: str | None = None) -> str:
        """Publish resources (runners use the newest for rollouts that name none); returns the id."""

    def latest_policy(self) -> Policy | None:
        """The newest policy version ready for rollouts (served to agents), if any."""

    def resources(self, resources_id: str) -> NamedResources:
        """The resources published under an id (empty when unknown)."""

    def start_service(self, name: str, *args: str) -> None:
        """Start a pipeline process by its ``litstream`` arguments (e.g. the GRPO trainer)."""

    def service_info(self, name: str) -> dict[str, Any]:
        """The health report of a process started by :meth:`start_service` (empty until it reports)."""

    def stopping(self) -> bool:
        """True once the user asked to stop (Ctrl-C): finish quickly, nothing more to submit."""

    def show(self, message: str) -> None:
        """A progress line for the user."""


def run_all(driver: Driver, tasks: Sequence[Any], mode: str, resources_id: str | None = None,
            timeout: float | None = None) -> list[RolloutResult]:
    """Submit one rollout per task and wait until all finished (or the user stops)."""
    metadata = _val_metadata(tasks) if mode == VAL else [{"data_id": str(i)} for i in range(len(tasks))]
    ids = set(driver.submit(tasks, mode=mode, resources_id=resources_id, metadata=metadata))
    results: list[RolloutResult] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    while ids and not driver.stopping() and (deadline is None or time.monotonic() < deadline):
        for r in driver.poll():
            if r.rollout_id in ids:
                ids.discard(r.rollout_id)
                results.append(r)
    return results


def mean_reward(results: Sequence[RolloutResult]) -> float | None:
    """Mean reward, a failed rollout or one without reward counting as 0 (it did not do the task)."""
    if not results:
        return None
    return sum(r.reward or 0.0 for r in results) / len(results)


@dataclass
class History:
    """What an algorithm measured: rewards by split and policy version, rollout counts."""

    train: dict[int, list[float]] = field(default_factory=dict)
    val: dict[int, list[float]] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)

    def add(self, r: RolloutResult, version: int | None = None) -> None:
        self.statuses[r.status] = self.statuses.get(r.status, 0) + 1
        v = version if version is not None else (r.version or 0)
        (self.val if r.mode == VAL else self.train).setdefault(v, []).append(r.reward or 0.0)

    @property
    def rollouts(self) -> int:
        return sum(self.statuses.values())

    @property
    def failed(self) -> int:
        return sum(n for s, n in self.statuses.items() if s != "succeeded")

    @staticmethod
    def means(by_version: dict[int, list[float]]) -> dict[int, float]:
        return {v: sum(rs) / len(rs) for v, rs in sorted(by_version.items()) if rs}


class Algorithm(abc.ABC):
    """Drives rollouts through a :class:`Driver`; records what it measured in ``self.history``."""

    name = "algorithm"
    trains_policy = False  # True: it starts a trainer; the policy server follows its versions
    uses_triplets = False  # True: the triplet processor must run

    def __init__(self) -> None:
        self.history = History()

    @abc.abstractmethod
    def run(self, driver: Driver, train: Sequence[Any], val: Sequence[Any] | None) -> None:
        """Train on ``train`` (validating on ``val``) until done or ``driver.stopping()``."""

    def prepare(self, driver: Driver) -> None:
        """Start what the algorithm needs before the runners start (default: nothing)."""

    def report(self) -> dict[str, Any]:
        """What the algorithm found, beyond the rewards (JSON-able; added to the fit summary)."""
        return {}

    def validate(self, driver: Driver, val: Sequence[Any], policy: Policy | None) -> float | None:
        results = run_all(driver, val, VAL, resources_id=policy.resources_id if policy else None)
        for r in results:
            self.history.add(r, policy.version if policy else 0)
        return mean_reward(results)


class Baseline(Algorithm):
    """No training: each task once, each validation task once (the reference's ``Baseline``, for ``dev``)."""

    name = "baseline"

    def __init__(self, passes: int = 1) -> None:
        super().__init__()
        self.passes = passes

    def run(self, driver: Driver, train: Sequence[Any], val: Sequence[Any] | None) -> None:
        policy = driver.latest_policy()
        for _ in range(self.passes):
            results = run_all(driver, train, TRAIN, resources_id=policy.resources_id if policy else None)
            for r in results:
                self.history.add(r, policy.version if policy else 0)
            driver.show(f"baseline: {len(results)} rollouts, mean reward {mean_reward(results) or 0:.3f}")
        if val:
            score = self.validate(driver, val, policy)
            driver.show(f"baseline: validation reward {score or 0:.3f}")


@dataclass
class GRPO(Algorithm):
    """Today's GRPO trainer, driven by a dataset: ``group_size`` copies of each task per pass (grouped by the
    task's data id), at most ``in_flight`` rollouts unfinished, validation on version 0 and every ``val_every``
    versions, and once more on the last version."""

    model: str = "tiny"
    group_size: int = 4
    groups_per_step: int = 8
    passes: int = 1  # passes over the training set
    val_every: int = 5
    in_flight: int | None = None  # default: two training windows
    max_staleness: int = 2
    lr: float = 1e-3
    ppo_epochs: int = 1
    entropy_coef: float = 0.0
    window_seconds: float | None = 20.0  # a short dataset still trains: a window also closes after this long
    max_versions: int | None = None  # stop after this many training steps (the trainer stops there too)
    minutes: float | None = None  # stop submitting after this long; the rollouts in flight still finish
    settle_seconds: float = 60.0  # at the end, how long the rollouts in flight get to finish
    # True: a training rollout names the policy served when it was submitted; False: it runs on the newest one
    # when a runner claims it (fresher, but an agent may see a publication before the policy server fronts it)
    pin_versions: bool = True
    # True: submit one training window of groups (pinned to the version) each time a new policy version is
    # published, two windows ahead at the start: every sample is trained one version after the one that made it
    # (one-step off-policy). A free-running queue instead lets samples age by two or more versions, which the
    # toy task measured as far slower learning (docs/training.md).
    waves: bool = True
    stall_seconds: float = 15.0  # waves: how long nothing outstanding and no new version counts as a stall
    seed: int = 0
    name: str = "grpo"
    trains_policy = True
    uses_triplets = True

    def __post_init__(self) -> None:
        super().__init__()
        self.tag = uuid.uuid4().hex[:8]  # group ids of this run, distinct from any earlier run on the same topic
        self._idle_since: float | None = None  # waves: since when nothing was outstanding without a new version

    def trainer_args(self) -> list[str]:
        return ["process", "trainer", "--policy", self.model, "--group-size", str(self.group_size),
                "--groups-per-step", str(self.groups_per_step), "--max-staleness", str(self.max_staleness),
                "--lr", str(self.lr), "--epochs", str(self.ppo_epochs), "--entropy-coef", str(self.entropy_coef),
                "--seed", str(self.seed),
                *(["--window-seconds", str(self.window_seconds)] if self.window_seconds else []),
                *(["--max-steps", str(self.max_versions)] if self.max_versions else [])]

    def prepare(self, driver: Driver) -> None:
        driver.start_service("trainer", *self.trainer_args())

    def run(self, driver: Driver, train: Sequence[Any], val: Sequence[Any] | None) -> None:
        policy = wait_for_policy(driver, lambda p: p.version >= 0, 600.0)
        if val:
            driver.show(f"v{policy.version}: validation reward {self.validate(driver, val, policy) or 0:.3f}")
        queue = [(p, i, task) for p in range(self.passes) for i, task in enumerate(train)]
        in_flight = self.in_flight or 2 * self.group_size * self.groups_per_step
        next_val = self.val_every
        pending_val: dict[str, int] = {}
        deadline = time.monotonic() + self.minutes * 60 if self.minutes else None
        settle: float | None = None
        waves_sent = policy.version  # waves start from the version the run begins with
        while (queue or driver.outstanding()) and not driver.stopping():
            policy = driver.latest_policy() or policy
            if queue and self._budget_spent(driver, deadline):
                queue.clear()  # nothing more to submit; the rollouts in flight finish
            if not queue:
                settle = settle or time.monotonic() + self.settle_seconds
                if time.monotonic() > settle:
                    break
            if val and self.val_every and policy.version >= next_val:
                ids = driver.submit(val, mode=VAL, resources_id=policy.resources_id, metadata=_val_metadata(val))
                pending_val.update(dict.fromkeys(ids, policy.version))
                next_val = (policy.version // self.val_every + 1) * self.val_every
            if self.waves:
                waves_sent = self._submit_waves(driver, queue, policy, waves_sent)
            while not self.waves and queue and driver.outstanding() + self.group_size <= max(in_flight,
                                                                                            self.group_size):
                self._submit_groups(driver, queue, 1, policy.resources_id if self.pin_versions else None)
            for r in driver.poll():
                self.history.add(r, pending_val.pop(r.rollout_id, None))
            driver.show(self._progress(policy, len(queue)))
        if driver.outstanding():
            self.history.statuses["unfinished"] = driver.outstanding()
        self._finish(driver, val)

    def _submit_waves(self, driver: Driver, queue: list[tuple[int, int, Any]], policy: Policy,
                      waves_sent: int) -> int:
        """One window of groups per published version, two ahead; returns the waves sent so far. If nothing is
        outstanding and no new version came for ``stall_seconds`` (failed rollouts left a window that cannot
        fill, or the trainer's window is larger than a wave), one more wave goes out on the current version."""
        now = time.monotonic()
        if driver.outstanding() or waves_sent < policy.version + 2:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now
        stalled = self._idle_since is not None and now - self._idle_since > self.stall_seconds
        while queue and (waves_sent < policy.version + 2 or stalled):
            self._submit_groups(driver, queue, self.groups_per_step, policy.resources_id)
            waves_sent += 1
            stalled, self._idle_since = False, None
        return waves_sent

    def _submit_groups(self, driver: Driver, queue: list[tuple[int, int, Any]], groups: int,
                       resources_id: str | None) -> None:
        """``groups`` tasks from the queue, ``group_size`` rollouts each, grouped by the task's data id."""
        for _ in range(min(groups, len(queue))):
            p, i, task = queue.pop(0)
            meta = {"group_id": f"{self.tag}-p{p}-d{i}", "data_id": str(i), "pass": p}
            driver.submit([task] * self.group_size, mode=TRAIN, resources_id=resources_id,
                          metadata=[meta] * self.group_size)

    def _budget_spent(self, driver: Driver, deadline: float | None) -> bool:
        trained = int(driver.service_info("trainer").get("version", 0))
        return ((self.max_versions is not None and trained >= self.max_versions)
                or (deadline is not None and time.monotonic() > deadline))

    def _progress(self, policy: Policy, queued: int) -> str:
        train = History.means(self.history.train)
        val = History.means(self.history.val)
        last_train = f"{train[max(train)]:.3f}" if train else "-"
        last_val = f"{val[max(val)]:.3f} (v{max(val)})" if val else "-"
        return (f"policy v{policy.version}: train reward {last_train}, validation {last_val}; "
                f"{self.history.rollouts} rollouts done, {queued} groups queued")

    def _finish(self, driver: Driver, val: Sequence[Any] | None) -> None:
        """Let the trainer take its last window, then validate the version it ends on."""
        if driver.stopping() or (self.max_versions is not None and not val):
            return
        before = driver.latest_policy()
        deadline = time.monotonic() + (self.window_seconds or 0.0) + 10
        while time.monotonic() < deadline and not driver.stopping():
            info = driver.service_info("trainer")
            if int(info.get("version", -1)) > (before.version if before else -1):
                break
            time.sleep(0.5)
        trained = int(driver.service_info("trainer").get("version", 0))
        policy = wait_for_policy(driver, lambda p: p.version >= trained, 60.0)
        if val and policy.version not in self.history.val:
            driver.show(f"v{policy.version}: validation reward {self.validate(driver, val, policy) or 0:.3f}")


def _val_metadata(tasks: Sequence[Any]) -> list[dict[str, Any]]:
    # A group of its own per validation rollout: the trainer never completes (so never trains on) such a group.
    return [{"group_id": f"val-{uuid.uuid4().hex}", "data_id": str(i)} for i in range(len(tasks))]


def wait_for_policy(driver: Driver, ok: Callable[[Policy], bool], timeout: float) -> Policy:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        policy = driver.latest_policy()
        if policy is not None and ok(policy):
            return policy
        if driver.stopping():
            break
        time.sleep(0.2)
    policy = driver.latest_policy()
    if policy is None:
        raise TimeoutError(f"no policy was published within {timeout:.0f}s: see the trainer's and the policy "
                           "server's logs")
    return policy


Critic = Callable[[str, float, Sequence[RolloutResult]], str]
POLICY_ENDPOINT = "policy"  # as a critic: the policy endpoint of the running stack, asked over the OpenAI API


class PromptSearch(Algorithm):
    """Publishes prompt templates instead of weights (the reference's APO, simplified): every candidate is
    published with the current LLM and scored by its validation reward; a ``critic`` (e.g. :func:`openai_critic`
    over any OpenAI-compatible endpoint, the policy endpoint included) proposes a new candidate from the best one
    for ``rounds`` rounds; the best template is published last and run on the training set.

    ``critic`` is a callable, an OpenAI-compatible base URL, or ``"policy"``: the stack's own policy endpoint
    (found when the search starts), asked for ``critic_model``."""

    name = "prompt-search"

    def __init__(self, candidates: Sequence[str], critic: Critic | str | None = None, rounds: int = 1,
                 critic_model: str = "tiny-policy", critic_max_tokens: int = 256) -> None:
        super().__init__()
        if not candidates:
            raise ValueError("PromptSearch needs at least one candidate template")
        self.candidates = list(candidates)
        self.critic_spec = critic
        self.critic_model, self.critic_max_tokens = critic_model, critic_max_tokens
        self.critic: Critic | None = self._openai_critic(critic) \
            if isinstance(critic, str) and critic != POLICY_ENDPOINT else critic if callable(critic) else None
        self.critic_errors: list[str] = []
        self.proposals: list[str] = []  # what the critic proposed, tried unless empty or already scored
        self.rounds = rounds
        self.scores: dict[str, float] = {}
        self.results: dict[str, list[RolloutResult]] = {}  # each template's validation rollouts, for the critic
        self.best: str | None = None

    def run(self, driver: Driver, train: Sequence[Any], val: Sequence[Any] | None) -> None:
        if self.critic_spec == POLICY_ENDPOINT:
            self.critic = self._policy_critic(driver)
        scored = val or train
        base = driver.latest_policy()
        llm = driver.resources(base.resources_id) if base else {}
        for k, template in enumerate(self._candidates(driver)):
            if driver.stopping():
                return
            rid = driver.publish({**llm, "prompt_template": PromptTemplate(template=template)})
            results = run_all(driver, scored, VAL, resources_id=rid)
            for r in results:
                self.history.add(r, k)
            self.scores[template], self.results[template] = mean_reward(results) or 0.0, results
            driver.show(f"template {k}: validation reward {self.scores[template]:.3f}: {template!r}")
        self.best = max(self.scores, key=lambda t: self.scores[t])
        rid = driver.publish({**llm, "prompt_template": PromptTemplate(template=self.best)})
        for r in run_all(driver, train, TRAIN, resources_id=rid):
            self.history.add(r, len(self.scores))

    def report(self) -> dict[str, Any]:
        return {"best_template": self.best, "template_scores": dict(self.scores),
                "proposals": list(self.proposals), "critic_errors": list(self.critic_errors)}

    def _policy_critic(self, driver: Driver) -> Critic:
        url = driver.service_info("policy-server").get("url")  # its health report names its bound URL
        if not url:
            raise RuntimeError("critic 'policy': no policy endpoint runs here (Trainer(serve_policy=False), or a "
                               "joined stack: give its URL)")
        return self._openai_critic(str(url))

    def _openai_critic(self, base_url: str) -> Critic:
        return openai_critic(base_url, self.critic_model, max_tokens=self.critic_max_tokens)

    def _candidates(self, driver: Driver) -> Any:
        yield from self.candidates
        for _ in range(self.rounds if self.critic else 0):
            best = max(self.scores, key=lambda t: self.scores[t])
            try:
                proposal = self.critic(best, self.scores[best], self.results[best]) if self.critic else best
            except Exception as exc:  # noqa: BLE001 (any client's error) the candidates scored so far still count
                self.critic_errors.append(f"{type(exc).__name__}: {exc}")
                driver.show(f"the critic failed, no proposal this round: {self.critic_errors[-1]}")
                continue
            self.proposals.append(proposal)
            if proposal and proposal not in self.scores:
                yield proposal


def openai_critic(base_url: str, model: str, api_key: str = "unused", max_tokens: int = 256) -> Critic:
    """A critic asking any OpenAI-compatible endpoint to improve the best template so far (in at most
    ``max_tokens``: the prompt and the answer must fit the model's context)."""

    def propose(template: str, score: float, _results: Sequence[RolloutResult]) -> str:
        import openai

        client = openai.OpenAI(base_url=base_url, api_key=api_key)
        answer = client.chat.completions.create(model=model, max_tokens=max_tokens, messages=[{
            "role": "user", "content": f"This prompt template scored {score:.3f} (0-1) on its tasks. Write an "
                                       f"improved template, keeping its {{placeholders}}. Template:\n{template}"}])
        return (answer.choices[0].message.content or "").strip()

    return propose
