"""An agent written for Agent Lightning 0.3, run by Agent Lightning's stock runner, trained by ``Trainer.fit``.

``Trainer(n_runners=0, gateway=True)`` starts no runner of its own; Agent Lightning's trainer, in its runner role
(``tests/agl_train_script.py``, in the Agent Lightning virtualenv), claims the rollouts through the gateway's
store API, calls the policy server through the ProxyLLM's per-attempt URL and sends its reward over OTLP. The
real embedded broker and chDB; GRPO steps on the triplets of those rollouts.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from bench.harness import _agl_env, agl_python
from litstream.app.fit import Trainer
from litstream.app.stack import running_stack
from litstream.infra.settings import Settings
from litstream.schemas.events import TripletEmitted
from litstream.trainer.algorithm import GRPO

SCRIPT = Path(__file__).parent / "agl_train_script.py"
TASKS = [{"letter": "a", "count": 1}, {"letter": "b", "count": 2}]


@pytest.fixture(scope="module")
def agl() -> Path:
    python, reason = agl_python(Console(stderr=True))
    if python is None:
        pytest.skip(f"no Agent Lightning virtualenv (.venv-agl): {reason}")
    return python


class AglRunner:
    """Starts the Agent Lightning runner once the stack file names the gateway; stopped when the test ends."""

    def __init__(self, python: Path, run_dir: Path) -> None:
        self.python, self.run_dir = python, run_dir
        self.proc: subprocess.Popen[str] | None = None
        self.url: str | None = None
        self.log = run_dir.parent / "agl-runner.log"
        self.thread = threading.Thread(target=self._start_when_served, daemon=True)

    def _start_when_served(self) -> None:
        for _ in range(2400):  # the pipeline and the trainer's first checkpoint come first
            info = running_stack(self.run_dir) or {}
            if info.get("gateway_url"):
                self.url = str(info["gateway_url"])
                out = self.log.open("w")
                self.proc = subprocess.Popen([str(self.python), str(SCRIPT), self.url], stdout=out,
                                             stderr=subprocess.STDOUT, text=True, env=_agl_env(),
                                             cwd=self.log.parent)  # AgentOps writes agentops.log in its cwd
                return
            time.sleep(0.25)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _triplets_of(settings: Settings, rollouts: int) -> list[TripletEmitted]:
    """The triplets topic, read again until every rollout's triplet is there (the processor finalizes an attempt a
    little after its last span)."""
    from litstream.infra.kafka import read_to_end
    from litstream.schemas.codec import default_codec

    codec = default_codec(settings.schema_registry_url)
    triplets: list[TripletEmitted] = []
    for _ in range(120):
        triplets = [codec.decode_as(m.value(), TripletEmitted)
                    for m in read_to_end(settings, f"{settings.topic_prefix}.triplets")]
        if len({t.meta.rollout_id for t in triplets}) >= rollouts:
            break
        time.sleep(0.5)
    return triplets


@pytest.mark.slow(enabled_by="LITSTREAM_LONG_RUNS")  # a minute or more; CI runs it (.ci/run)
@pytest.mark.timeout(600)
def test_the_agl_stock_runner_through_the_gateway_is_trained(agl: Path, tmp_path: Path) -> None:
    from litstream.trainer.checkpoint import list_checkpoints

    settings = Settings(data_dir=tmp_path / "data", partitions=2)
    runner = AglRunner(agl, settings.data_dir / "train")
    rollouts = len(TASKS) * 4 * 2
    triplets: list[TripletEmitted] = []

    def when_trained(s: Settings) -> None:  # the stack still runs: stop the runner first, then read
        runner.stop()
        triplets.extend(_triplets_of(s, rollouts))

    algorithm = GRPO(group_size=4, groups_per_step=2, max_versions=2, window_seconds=None, passes=2)
    runner.thread.start()
    try:
        summary = Trainer(algorithm=algorithm, n_runners=0, gateway=True, settings=settings, quiet=True,
                          on_finish=when_trained).fit(None, TASKS)
    finally:
        runner.stop()
    log = runner.log.read_text() if runner.log.exists() else ""
    assert runner.url is not None and summary.extra["gateway_url"] == runner.url
    assert summary.rollouts == rollouts, (summary.as_dict(), log[-3000:])
    assert summary.by_status == {"succeeded": rollouts}, log[-3000:]  # every rollout ran and succeeded
    assert len({t.meta.rollout_id for t in triplets}) == rollouts  # each gave its triplet: nothing lost
    assert all(t.prompt_token_ids and t.response_token_ids and t.reward is not None for t in triplets)
    assert all(t.response_logprobs for t in triplets)  # the policy server's copy of each call
    assert summary.run_id is not None
    checkpoints = settings.data_dir / "train" / "checkpoints" / summary.run_id  # each run's own
    assert max(v for v, _ in list_checkpoints(checkpoints)) >= 1  # the trainer stepped on those triplets
