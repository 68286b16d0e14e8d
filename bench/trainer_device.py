"""The learner on an accelerator: a few GRPO steps of the tool-using example's model with LoRA and with the top
blocks, on ``--device`` at ``--precision``, each checked against the CPU path in float32.

    python -m bench.trainer_device --device cuda            # SmolLM2-135M in bf16 on the GPU
    python -m bench.trainer_device --device cpu --model tiny --precision fp32 --steps 1   # what the tests run

For each way of training (``top-blocks``: the model's default top blocks; ``lora``: rank ``--lora-rank``
adapters), on one window of the weather example's questions (its prompts through the model's Hugging Face chat
template, given the tool, which SmolLM2's leaves out; responses sampled by the CPU engine at the model's
temperature; rewards alternating 0/1 within each group): the response log-probs on the device against the
CPU's (max and mean absolute difference), the seconds and tokens per second of each step, the peak device memory,
and the step statistics (ratio, clipped share, gradient norm). It writes the rows as JSON to ``--out``;
docs/training.md records the figures of a GPU run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from litstream.trainer.defaults import defaults_for, with_lora_lr
from litstream.trainer.engines import TorchEngine
from litstream.trainer.grpo import pack
from litstream.trainer.learner import GrpoLearner, LearnerConfig
from litstream.trainer.policy import build_policy
from litstream.trainer.samples import Sample

MODES = ("top-blocks", "lora")


def window(model: str, groups: int, group_size: int, max_tokens: int, seed: int = 0) -> list[Sample]:
    """One window of the weather example's first calls, sampled on the CPU in float32."""
    from examples import weather_task as wa

    policy = build_policy(model, seed=0)  # type: ignore[arg-type]
    tok = policy.tokenizer
    engine = TorchEngine(policy.model, tok)
    temperature = defaults_for(model).temperature
    out: list[Sample] = []
    for g, task in enumerate(wa.make_dataset(groups, seed)):
        text = f"{wa.SYSTEM}\n{wa.question(task)}"
        prompt = tok.encode(text) if model == "tiny" else _chat(tok, wa, task)
        for i, gen in enumerate(engine.generate([prompt] * group_size, max_tokens, temperature=temperature,
                                                seed=seed * 1000 + g)):
            out.append(Sample(rollout_id=f"ro-{g}-{i}", attempt_id="at", index=0, group_id=f"g{g}",
                              policy_version=0, prompt_token_ids=gen.prompt_token_ids,
                              response_token_ids=gen.token_ids, response_logprobs=gen.logprobs,
                              reward=float(i % 2), temperature=temperature))
    return out


def _chat(tok: Any, wa: Any, task: dict[str, Any]) -> list[int]:
    hf = tok.to_hf() if callable(getattr(tok, "to_hf", None)) else tok.tok
    messages = [{"role": "system", "content": wa.SYSTEM},
                {"role": "user", "content": wa.question(task)}]
    ids = hf.apply_chat_template(messages, tools=wa.TOOLS, add_generation_prompt=True, tokenize=True)
    return [int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)]


def learner_config(model: str, mode: str, device: str, precision: str, lora_rank: int) -> LearnerConfig:
    d = defaults_for(model)
    if mode == "lora":
        return LearnerConfig(lr=with_lora_lr(d).lr, epochs=d.epochs, temperature=d.temperature, lora_rank=lora_rank,
                             device=device, precision=precision)
    return LearnerConfig(lr=d.lr, epochs=d.epochs, temperature=d.temperature, train_top_layers=d.train_top_layers,
                         device=device, precision=precision)


def run_mode(model: str, mode: str, samples: list[Sample], device: str, precision: str, steps: int,
             lora_rank: int) -> dict[str, Any]:
    policy = build_policy(model, seed=0)  # type: ignore[arg-type]
    cpu = GrpoLearner(policy.model, policy.tokenizer, learner_config(model, mode, "cpu", "fp32", lora_rank))
    on_device = GrpoLearner(build_policy(model, seed=0).model, policy.tokenizer,  # type: ignore[arg-type]
                            learner_config(model, mode, device, precision, lora_rank))
    mask = pack([s.prompt_token_ids for s in samples], [s.response_token_ids for s in samples],
                policy.tokenizer.pad_id).response_mask.bool()
    want, got = cpu.score(samples), on_device.score(samples)
    diff = (want - got).abs()[mask]
    trained = sum(p.numel() for p in on_device.model.parameters() if p.requires_grad)
    row: dict[str, Any] = {"mode": mode, "device": device, "precision": precision, "model": model,
                           "samples": len(samples), "trained_parameters": trained,
                           "logprob_max_abs_diff": float(diff.max()), "logprob_mean_abs_diff": float(diff.mean()),
                           "steps": []}
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        st = on_device.step([samples])
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        row["steps"].append({"seconds": round(seconds, 3), "tokens_per_s": round(st.tokens / seconds, 1),
                             "ratio": round(st.ratio_mean, 4), "clipped": round(st.clip_frac, 4),
                             "grad_norm": round(st.grad_norm, 4), "loss": round(st.loss, 5)})
    if device.startswith("cuda"):
        row["peak_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--model", default="smollm2", help="smollm2 (the example's) or tiny")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps timed per way of training")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48, help="the example's answer budget")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES))
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: this machine's torch sees no CUDA device")
    print(f"sampling one window ({args.groups} x {args.group_size}) of {args.model} on the CPU ...", flush=True)
    samples = window(args.model, args.groups, args.group_size, args.max_tokens)
    rows = []
    for mode in args.modes:
        row = run_mode(args.model, mode, samples, args.device, args.precision, args.steps, args.lora_rank)
        rows.append(row)
        steps = ", ".join(f"{s['seconds']:.2f} s ({s['tokens_per_s']:.0f} tok/s)" for s in row["steps"])
        print(f"{mode}: {row['trained_parameters']:,} trained; log-probs vs CPU fp32: max |diff| "
              f"{row['logprob_max_abs_diff']:.4f}, mean {row['logprob_mean_abs_diff']:.5f}; steps: {steps}"
              + (f"; peak {row['peak_memory_mib']} MiB" if "peak_memory_mib" in row else ""), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
