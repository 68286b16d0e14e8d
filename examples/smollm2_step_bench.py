"""How long one GRPO step takes on SmolLM2-135M-Instruct, trained in full or with parts frozen.

One window shaped like the word-problem example's (``--groups`` groups of 8, the example's chat prompts, responses
of ``--response-tokens`` tokens), stepped ``--steps`` times after one warm-up step, on ``--threads`` threads (the
trainer process trains on one), for each setting:

    full        every parameter trained
    no-embed    the input embeddings and the output layer frozen (57M of the 163M parameters)
    top-K       only the top K of the 30 transformer blocks and the final norm trained
                (``LearnerConfig.train_top_layers``, ``--train-top-layers K``)
    top-K+head  the same and the output layer

    python -m examples.smollm2_step_bench --groups 4 --settings full,top-15,top-8,top-8+head
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from examples.arithmetic_agent import DATA_DIR, read_jsonl, render_prompt


def _freeze(model: torch.nn.Module, setting: str) -> None:
    """Set which parameters train (a ``top-K`` setting: the learner's ``train_top_layers``)."""
    from litstream.trainer.learner import train_top_layers

    for p in model.parameters():
        p.requires_grad_(True)
    if setting == "full":
        return
    if setting == "no-embed":
        model.get_input_embeddings().weight.requires_grad_(False)
        model.get_output_embeddings().weight.requires_grad_(False)
        return
    top, _, head = setting.removeprefix("top-").partition("+")
    train_top_layers(model, int(top))
    if head == "head":
        model.get_output_embeddings().weight.requires_grad_(True)


def main() -> None:
    from litstream.trainer.learner import GrpoLearner, LearnerConfig
    from litstream.trainer.policy import load_smollm2
    from litstream.trainer.windows import Sample

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--response-tokens", type=int, default=24)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--settings", default="full,top-15,top-8")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rng = random.Random(0)
    policy = load_smollm2()
    tok = policy.tokenizer.tok
    tasks = read_jsonl(DATA_DIR / "arithmetic_train.jsonl")[: args.groups]
    groups: list[list[Sample]] = []
    for g, task in enumerate(tasks):
        prompt = tok.apply_chat_template([{"role": "user", "content": render_prompt(task)}],
                                         add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        groups.append([])
        for i in range(8):
            response = [rng.randrange(1000, 20000) for _ in range(args.response_tokens)]
            groups[-1].append(Sample(f"r{g}-{i}", "a", 0, f"g{g}", 0, prompt, response, [-2.0] * len(response),
                                  float(i % 2)))
    results = []
    for setting in args.settings.split(","):
        _freeze(policy.model, setting)
        trained = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
        # lr 0: the weights stay; the learner trains what requires a gradient (it would freeze the same for top-K)
        learner = GrpoLearner(policy.model, policy.tokenizer, LearnerConfig(lr=0.0))
        learner.step(groups)  # warm-up
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            learner.step(groups)
            times.append(time.perf_counter() - t0)
        samples = [s for g in groups for s in g]
        results.append({"setting": setting, "threads": args.threads, "trained_params_M": round(trained / 1e6, 1),
                        "samples": len(samples),
                        "tokens": sum(len(s.prompt_token_ids) + len(s.response_token_ids) for s in samples),
                        "step_s": [round(t, 2) for t in times]})
        print(json.dumps(results[-1]), flush=True)
        del learner


if __name__ == "__main__":
    main()
