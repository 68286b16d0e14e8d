"""The closed loop in one process: engine generates -> reward -> windows -> learner step -> checkpoint -> the
engine takes the new version. The trainer process (``process.py``) does the same with the generation and the reward
on the far side of the topics; this is its reference and the toy task's measurement.

    python -m litstream.trainer.loop --steps 30 --out /tmp/loop
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from litstream.schemas.events import EventMeta, TripletEmitted
from litstream.schemas.policy_versions import policy_resources_id

from . import toy_task
from .engines import Generation, InferenceEngine, TorchEngine
from .learner import GrpoLearner, LearnerConfig, StepStats
from .policy import PolicyKind, build_policy
from .windows import WindowConfig, Windower


@dataclass
class LoopConfig:
    steps: int = 20
    groups_per_step: int = 8
    group_size: int = 4
    max_new_tokens: int = toy_task.MAX_NEW_TOKENS
    temperature: float = 1.0
    seed: int = 0
    policy: PolicyKind = "tiny"
    keep_last: int = 2
    learner: LearnerConfig = field(default_factory=lambda: LearnerConfig(lr=5e-3))


@dataclass
class LoopRecord:
    step: int
    version: int  # the policy version that generated this step's samples
    reward_mean: float
    exact: float  # fraction of samples with reward 1
    train: StepStats | None
    generate_s: float
    save_s: float
    swap_s: float


def triplet(gen: Generation, task: dict[str, Any], group_id: str, index: int, version: int,
            reward: float, prompt_text: str) -> TripletEmitted:
    """What a runner would put on the triplets topic for one sample."""
    rid = f"ro-{uuid.uuid4().hex[:12]}"
    meta = EventMeta(event_id=uuid.uuid4().hex, rollout_id=rid, producer_id="loop", producer_seq=index + 1,
                     timestamp_ns=time.time_ns())
    return TripletEmitted(meta=meta, attempt_id="at-1", group_id=group_id, index=0,
                          policy_version=policy_resources_id(version), resources_id=policy_resources_id(version),
                          prompt_token_ids=gen.prompt_token_ids, response_token_ids=gen.token_ids,
                          response_logprobs=gen.logprobs, prompt_text=prompt_text, response_text=gen.text,
                          reward=reward, metadata={"task": task})


def run_loop(cfg: LoopConfig, checkpoint_dir: str | Path, engine: InferenceEngine | None = None,
             on_record: Callable[[LoopRecord], None] | None = None) -> list[LoopRecord]:
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    policy = build_policy(cfg.policy, seed=cfg.seed)
    tok = policy.tokenizer
    # The learner scores at the temperature the engine samples at (its log-probs are at it too).
    learner = GrpoLearner(policy.model, tok, replace(cfg.learner, temperature=cfg.temperature
                                                     if cfg.temperature > 0 else 1.0))
    path = learner.save(checkpoint_dir, keep_last=cfg.keep_last)
    # The engine holds its own copy of the weights, loaded from the checkpoint, as a served model would.
    engine = engine or TorchEngine.from_checkpoint(path)
    per_window = cfg.groups_per_step * cfg.group_size
    windower = Windower(WindowConfig(group_size=cfg.group_size, max_samples=per_window), learner.version)
    records: list[LoopRecord] = []
    for step in range(cfg.steps):
        tasks = [toy_task.make_task(rng) for _ in range(cfg.groups_per_step)]
        texts = [toy_task.render_prompt(t) for t in tasks for _ in range(cfg.group_size)]
        t0 = time.perf_counter()
        gens = engine.generate([tok.encode(x) for x in texts], cfg.max_new_tokens, cfg.temperature,
                               seed=cfg.seed * 1_000_003 + step)
        gen_s = time.perf_counter() - t0
        version = engine.version
        rewards, triplets = [], []
        for i, (gen, text) in enumerate(zip(gens, texts)):
            task = tasks[i // cfg.group_size]
            r = toy_task.reward(task, gen.text)
            rewards.append(r)
            triplets.append(triplet(gen, task, f"s{step}-g{i // cfg.group_size}", i, version, r, text))
        windows = windower.add_many(triplets, now=time.monotonic())
        stats, save_s, swap_s = None, 0.0, 0.0
        for w in windows:
            stats = learner.step(w.groups)
            t1 = time.perf_counter()
            path = learner.save(checkpoint_dir, keep_last=cfg.keep_last)
            save_s = time.perf_counter() - t1
            swap_s = engine.apply_version(learner.version, path)
            windower.set_version(learner.version)
        rec = LoopRecord(step=step, version=version, reward_mean=sum(rewards) / len(rewards),
                         exact=sum(1 for r in rewards if r >= 1.0) / len(rewards), train=stats,
                         generate_s=gen_s, save_s=save_s, swap_s=swap_s)
        records.append(rec)
        if on_record:
            on_record(rec)
    return records


def _print(rec: LoopRecord) -> None:
    t = rec.train
    extra = (f" loss={t.loss:+.4f} clip={t.clip_frac:.3f} ent={t.entropy:.2f} train={t.seconds:.2f}s"
             if t else "")
    print(f"step {rec.step:3d} v{rec.version:<3d} reward={rec.reward_mean:.3f} exact={rec.exact:.2f} "
          f"gen={rec.generate_s:.2f}s save={rec.save_s:.3f}s swap={rec.swap_s:.3f}s{extra}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="checkpoint directory (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the per-step records here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = LoopConfig(steps=args.steps, groups_per_step=args.groups, group_size=args.group_size, seed=args.seed,
                     learner=LearnerConfig(lr=args.lr))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        recs = run_loop(cfg, args.out or tmp, on_record=_print)
        print(f"{len(recs)} steps in {time.perf_counter() - t0:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in recs], indent=1))


if __name__ == "__main__":
    main()
