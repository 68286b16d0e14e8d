"""`litstream export`: a run's trajectories as a dataset. Triplets as the triplet processor stores them (a two-turn
tool-using attempt and a one-call attempt) come out as one record per attempt in TRL's conversational format,
which `datasets` loads from JSONL and Parquet and TRL's SFTTrainer trains on unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from litstream.schemas.events import EventFactory, RolloutEnqueued, TripletEmitted
from litstream.streams.event_rows import Positioned, event_arrow, triplet_arrow
from litstream.trainer.export import ExportFilter, trajectory_records
from tests.samples import stored_history

F = EventFactory(role="test")
CALL = {"id": "call_1", "type": "function", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
ASK = {"role": "user", "content": "How warm is it in Oslo?"}
CALLED = {"role": "assistant", "content": "", "tool_calls": json.dumps([CALL])}  # as the policy endpoint records it
RESULT = {"role": "tool", "content": "7 C", "tool_call_id": "call_1"}


def triplet(rid: str, index: int, prompt: list[int], response: list[int], prompt_messages: list[dict[str, str]],
            response_messages: list[dict[str, str]], reward: float | None, version: str = "3") -> TripletEmitted:
    return TripletEmitted(meta=F.meta(rid), attempt_id=f"at-{rid}", group_id="task-oslo", index=index,
                          policy_version=version, prompt_token_ids=prompt, response_token_ids=response,
                          response_logprobs=[-0.5] * len(response), prompt_text="", response_text="", reward=reward,
                          metadata={"prompt_messages": prompt_messages, "response_messages": response_messages})


def tool_attempt(rid: str = "ro-tool") -> list[TripletEmitted]:
    """A forced call, then the answer: the second prompt is the first prompt, its call and the tool's result."""
    first = triplet(rid, 0, [1, 2, 3], [4, 5], [ASK], [CALLED], None)
    second = triplet(rid, 1, [1, 2, 3, 4, 5, 6, 7], [8, 9], [ASK, CALLED, RESULT],
                     [{"role": "assistant", "content": "It is 7 C in Oslo."}], 1.0, version="4")
    return [second, first]  # any order


def test_an_attempt_is_one_conversation_with_its_tool_call_and_its_tokens_joined() -> None:
    one_call = triplet("ro-one", 0, [1, 2], [3], [ASK], [{"role": "assistant", "content": "No idea."}], 0.0)
    records = trajectory_records([*tool_attempt(), one_call], {"ro-tool": "train", "ro-one": "val"}, run="train")
    tool, single = records
    assert [m["role"] for m in tool["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert tool["messages"][1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    assert tool["messages"][2]["tool_call_id"] == "call_1"
    assert (tool["reward"], tool["task_id"], tool["mode"], tool["run"], tool["turns"]) == (1.0, "task-oslo", "train",
                                                                                          "train", 2)
    assert (tool["policy_version"], tool["policy_versions"]) == (3, [3, 4])
    # The joined sequence: the tool result (6, 7) was not sampled, so it is masked out of the loss.
    assert tool["prompt_token_ids"] == [1, 2, 3]
    assert tool["response_token_ids"] == [4, 5, 6, 7, 8, 9] and tool["response_loss_mask"] == [1, 1, 0, 0, 1, 1]
    assert single["response_loss_mask"] == [1] and single["mode"] == "val"

    assert [r["rollout_id"] for r in records if ExportFilter(min_reward=0.5).keeps(r)] == ["ro-tool"]
    assert [r["rollout_id"] for r in records if ExportFilter(mode="val").keeps(r)] == ["ro-one"]
    assert [r["rollout_id"] for r in records if ExportFilter(min_version=4).keeps(r)] == []


def test_a_call_forced_by_tool_choice_is_left_out_of_the_supervised_mask() -> None:
    """Drawn under a grammar, the first turn's call was the agent's decision: 0 in the mask (a fine-tuning on it
    teaches the model to call where nothing asks it to); the answer the model chose stays 1."""
    first, second = sorted(tool_attempt("ro-forced"), key=lambda t: t.index)
    forced = first.model_copy(update={"metadata": {**first.metadata, "constrained": True,
                                                   "grammar": 'start: "call"'}})
    (record,) = trajectory_records([forced, second], {}, run="train")
    assert record["response_token_ids"] == [4, 5, 6, 7, 8, 9] and record["response_loss_mask"] == [0, 0, 0, 0, 1, 1]
    (alone,) = trajectory_records([forced], {}, run="train")
    assert alone["response_loss_mask"] == [0, 0]


def test_a_trajectory_names_the_run_its_triplets_came_from() -> None:
    in_run = triplet("ro-run", 0, [1], [2], [ASK], [{"role": "assistant", "content": "7"}], 1.0)
    in_run = in_run.model_copy(update={"meta": in_run.meta.model_copy(update={"run_id": "run-20261129T050000Z-abcdef"})})
    older = triplet("ro-old", 0, [1], [2], [ASK], [{"role": "assistant", "content": "7"}], 1.0)
    records = trajectory_records([in_run, older], {}, run="train")
    assert [r["run"] for r in records] == ["run-20261129T050000Z-abcdef", "train"]  # before runs: the data dir's
    assert [r["rollout_id"] for r in records if ExportFilter(run="run-20261129T050000Z-abcdef").keeps(r)] == ["ro-run"]


def test_turns_that_do_not_join_keep_the_conversation_and_leave_the_tokens_out() -> None:
    first, second = sorted(tool_attempt(), key=lambda t: t.index)
    apart = second.model_copy(update={"prompt_token_ids": [9, 9, 9, 9]})  # re-tokenised: no longer extends turn 1
    (record,) = trajectory_records([first, apart], {}, run="train")
    assert len(record["messages"]) == 4 and record["mode"] is None
    assert record["prompt_token_ids"] is record["response_token_ids"] is record["response_loss_mask"] is None


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    """A run's data dir whose ClickHouse holds the triplets and enqueue events the pipeline would have stored."""
    enqueued = RolloutEnqueued(meta=F.meta("ro-tool"), input={"city": "Oslo"}, start_time=1.0, mode="train")
    yield stored_history(tmp_path / "train", {"triplets": triplet_arrow(tool_attempt()),
                                             "rollout_events": event_arrow([Positioned(enqueued, 0, 0)])})


def test_the_export_loads_with_datasets_and_trains_with_trl_unchanged(run_dir: Path, tmp_path: Path) -> None:
    from datasets import load_dataset
    from trl.data_utils import is_conversational

    for name in ("run.jsonl", "run.parquet"):
        out = subprocess.run([sys.executable, "-m", "litstream.app.cli", "export", "--out", str(tmp_path / name),
                              "--mode", "train"], env={**os.environ, "LITSTREAM_DATA_DIR": str(run_dir)},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "wrote 1 of 1 trajectories (2 triplets)" in out.stderr
        kind = "json" if name.endswith(".jsonl") else "parquet"
        dataset = load_dataset(kind, data_files=str(tmp_path / name), split="train")
        row = dataset[0]
        assert is_conversational(row) and row["reward"] == 1.0 and row["response_loss_mask"] == [1, 1, 0, 0, 1, 1]
        assert row["messages"][1]["tool_calls"][0]["function"]["name"] == "get_weather"
        sft_one_step(dataset, tmp_path / f"sft-{kind}")

    refused = subprocess.run([sys.executable, "-m", "litstream.app.cli", "export", "--out", str(tmp_path / "x.csv")],
                             env={**os.environ, "LITSTREAM_DATA_DIR": str(run_dir)}, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "--format jsonl or parquet" in refused.stderr


def sft_one_step(dataset: object, output_dir: Path) -> None:
    """TRL's SFTTrainer, given the dataset as loaded (extra columns and all), on a small model and tokenizer made
    here (nothing is downloaded), takes a step with a finite loss."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel()
    raw.train_from_iterator(["How warm is it in Oslo?", "It is 7 C in Oslo."], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
                               "{% for c in m['tool_calls'] or [] %}{{ c['function']['name'] }}"
                               "{{ c['function']['arguments'] }}{% endfor %}\n{% endfor %}")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=256))
    trainer = SFTTrainer(model=model, train_dataset=dataset, processing_class=tokenizer,
                         args=SFTConfig(output_dir=str(output_dir), max_steps=1, per_device_train_batch_size=1,
                                        report_to=[], save_strategy="no", use_cpu=True))
    loss = trainer.train().training_loss
    assert loss == loss and loss > 0  # finite, not NaN
