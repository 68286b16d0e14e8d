"""A run's trajectories as a dataset (``litstream export``): one record per attempt, in the conversational format
TRL's trainers and ``datasets`` read (``messages`` with tool calls), with what litstream knows beside it — the
reward, the policy versions that generated it, the task, the rollout and attempt, and the token ids with the mask
of the tokens the model sampled (the attempt's turns joined as the trainer joins them, trainer/trajectories.py).

Read from ClickHouse's ``triplets`` table (every triplet the triplet processor made) and the rollouts' modes from
``rollout_events``; the pure part, :func:`trajectory_records`, turns triplets into records.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from litstream.infra import clickhouse
from litstream.schemas.events import TripletEmitted

from .trajectories import join_turns
from .windows import to_sample, triplet_version

FORMATS = ("jsonl", "parquet")

PAGE_ROWS = 2000  # triplets per query: within the engine's per-query limits (LITSTREAM_SQL_MAX_*) however large
TRIPLETS_SQL = """
SELECT rollout_id, attempt_id, `index`, group_id, policy_version, resources_id, prompt_token_ids,
       response_token_ids, response_logprobs, prompt_text, response_text, reward, metadata_json, event_id,
       producer_id, producer_seq, toUnixTimestamp64Nano(timestamp), run_id
FROM triplets FINAL
WHERE (rollout_id, attempt_id, `index`) > ({rollout_id:String}, {attempt_id:String}, {index:Int64})
  AND ({run:String} = '' OR run_id = {run:String})
ORDER BY rollout_id, attempt_id, `index` LIMIT {limit:UInt32}
"""
MODES_SQL = """
SELECT rollout_id, argMax(mode, timestamp) FROM rollout_events
WHERE event_type IN ('RolloutEnqueued', 'RolloutUpdated') AND mode != '' AND rollout_id > {rollout_id:String}
GROUP BY rollout_id ORDER BY rollout_id LIMIT {limit:UInt32}
"""

_TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()),
                        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(_TOOL_CALL)),
                      ("tool_call_id", pa.string())])
SCHEMA = pa.schema([
    ("messages", pa.list_(_MESSAGE)), ("reward", pa.float64()), ("task_id", pa.string()), ("run", pa.string()),
    ("mode", pa.string()), ("rollout_id", pa.string()), ("attempt_id", pa.string()),
    ("policy_version", pa.int64()), ("policy_versions", pa.list_(pa.int64())), ("turns", pa.int64()),
    ("prompt_token_ids", pa.list_(pa.int64())), ("response_token_ids", pa.list_(pa.int64())),
    ("response_loss_mask", pa.list_(pa.int64())),
])


@dataclass(frozen=True)
class ExportFilter:
    run: str | None = None  # the training run's id
    mode: str | None = None  # the rollouts' mode: train, val, test
    min_version: int | None = None  # the oldest version among a trajectory's turns, inclusive
    max_version: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    def keeps(self, record: dict[str, Any]) -> bool:
        version, reward = record["policy_version"], record["reward"]
        if self.run is not None and record["run"] != self.run:
            return False
        if self.mode is not None and record["mode"] != self.mode:
            return False
        if (self.min_version is not None or self.max_version is not None) and version is None:
            return False
        if self.min_version is not None and version < self.min_version:
            return False
        if self.max_version is not None and version > self.max_version:
            return False
        if (self.min_reward is not None or self.max_reward is not None) and reward is None:
            return False
        if self.min_reward is not None and reward < self.min_reward:
            return False
        return self.max_reward is None or reward <= self.max_reward


def trajectory_records(triplets: Iterable[TripletEmitted], modes: dict[str, str], run: str) -> list[dict[str, Any]]:
    """One record per attempt, from its triplets (any order); the attempts in the order first seen. ``run``:
    a record's run when its triplets name none (written before runs were recorded)."""
    attempts: dict[tuple[str, str], list[TripletEmitted]] = {}
    for t in triplets:
        attempts.setdefault((t.meta.rollout_id, t.attempt_id), []).append(t)
    return [_record(sorted(ts, key=lambda t: t.index), modes.get(rid), run) for (rid, _), ts in attempts.items()]


def _record(turns: Sequence[TripletEmitted], mode: str | None, run: str) -> dict[str, Any]:
    last = turns[-1]
    versions = [triplet_version(t) for t in turns]
    known = [v for v in versions if v is not None]
    rewards = [t.reward for t in turns if t.reward is not None and math.isfinite(t.reward)]
    prompt, response, mask = _tokens(turns)
    return {
        "messages": [_message(m) for m in [*_messages(last, "prompt_messages"), *_messages(last, "response_messages")]],
        "reward": rewards[-1] if rewards else None, "task_id": last.group_id, "run": last.meta.run_id or run,
        "mode": mode,
        "rollout_id": last.meta.rollout_id, "attempt_id": last.attempt_id,
        "policy_version": min(known) if known else None, "policy_versions": versions, "turns": len(turns),
        "prompt_token_ids": prompt, "response_token_ids": response, "response_loss_mask": mask,
    }


def _tokens(turns: Sequence[TripletEmitted]) -> tuple[list[int] | None, list[int] | None, list[int] | None]:
    """The attempt as one sequence, as the trainer joins it: (prompt, response, loss mask: 1 where the model chose
    the token); all None when its turns do not join (a prompt that does not extend the previous turn).

    A turn drawn under a grammar (a tool call forced by ``tool_choice``) is 0 too: the agent decided to call, not
    the model. GRPO scores such a turn under its grammar; a plain cross-entropy on it (supervised fine-tuning)
    would teach the model to call tools where nothing asks it to (measured: a warm start trained on forced calls
    called the tool again instead of answering)."""
    joined = join_turns([to_sample(t, turn=True) for t in turns]) if len(turns) > 1 else to_sample(turns[0], turn=True)
    if isinstance(joined, str):
        return None, None, None
    mask = list(joined.loss_mask) if joined.loss_mask is not None else [1] * len(joined.response_token_ids)
    for g in joined.grammars:
        mask[g.start:g.end] = [0] * (g.end - g.start)
    return list(joined.prompt_token_ids), list(joined.response_token_ids), mask


def _messages(t: TripletEmitted, key: str) -> list[dict[str, Any]]:
    raw = t.metadata.get(key)
    if isinstance(raw, dict):  # recorded as numbered parts
        raw = [raw[k] for k in sorted(raw, key=lambda k: int(k) if str(k).isdigit() else 0)]
    if isinstance(raw, list):
        return [m for m in raw if isinstance(m, dict)]
    text = t.prompt_text if key == "prompt_messages" else t.response_text
    role = "user" if key == "prompt_messages" else "assistant"
    return [{"role": role, "content": text}] if text else []


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A recorded message in OpenAI's shape (TRL's conversational format): role, content, tool calls as
    ``{"id", "type", "function": {"name", "arguments"}}`` and a tool result's ``tool_call_id``."""
    content = m.get("content")
    return {"role": str(m.get("role") or "user"),
            "content": content if isinstance(content, str) else json.dumps(content) if content is not None else "",
            "tool_calls": [_tool_call(c) for c in _calls(m.get("tool_calls"))] or None,
            "tool_call_id": str(m["tool_call_id"]) if m.get("tool_call_id") is not None else None}


def _calls(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return []
    return [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []


def _tool_call(c: dict[str, Any]) -> dict[str, Any]:
    nested = c.get("function")
    function: dict[str, Any] = nested if isinstance(nested, dict) else c  # nested (OpenAI) or flat (spans)
    arguments = function.get("arguments")
    return {"id": str(c.get("id") or ""), "type": "function",
            "function": {"name": str(function.get("name") or ""),
                         "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {})}}


# -- reading and writing ------------------------------------------------------------------------------------


def read_triplets(dsn: str, run_id: str | None = None, may_open: bool = True,
                  wait_s: float | None = None) -> tuple[list[TripletEmitted], dict[str, str]]:
    """Every triplet in ClickHouse (page after page; only ``run_id``'s when given), and each rollout's mode;
    through the chDB owner when a stack runs, else on the directory itself (``may_open=False``: never, as
    :func:`litstream.infra.clickhouse.reader`)."""
    triplets: list[TripletEmitted] = []
    after: clickhouse.Parameters = {"rollout_id": "", "attempt_id": "", "index": -1, "limit": PAGE_ROWS,
                                    "run": run_id or ""}
    with clickhouse.reader(dsn, timeout=600, may_open=may_open, wait_s=wait_s) as run:
        while True:
            rows = run(TRIPLETS_SQL, after).rows
            triplets += [_triplet(r) for r in rows]
            if len(rows) < PAGE_ROWS:
                break
            after = {**after, "rollout_id": rows[-1][0], "attempt_id": rows[-1][1], "index": int(rows[-1][2])}
        modes: dict[str, str] = {}
        last = ""
        while True:
            rows = run(MODES_SQL, {"rollout_id": last, "limit": PAGE_ROWS}).rows
            modes.update((str(r[0]), str(r[1])) for r in rows)
            if len(rows) < PAGE_ROWS:
                break
            last = str(rows[-1][0])
    return triplets, modes


def _triplet(r: Sequence[Any]) -> TripletEmitted:
    (rollout_id, attempt_id, index, group_id, policy_version, resources_id, prompt_ids, response_ids, logprobs,
     prompt_text, response_text, reward, metadata_json, event_id, producer_id, producer_seq, timestamp_ns, run_id) = r
    return TripletEmitted.model_validate({
        "meta": {"event_id": event_id, "rollout_id": rollout_id, "producer_id": producer_id,
                 "producer_seq": producer_seq, "timestamp_ns": timestamp_ns, "run_id": run_id or None},
        "attempt_id": attempt_id, "group_id": group_id, "index": index, "policy_version": policy_version or None,
        "resources_id": resources_id or None, "prompt_token_ids": prompt_ids, "response_token_ids": response_ids,
        "response_logprobs": logprobs, "prompt_text": prompt_text, "response_text": response_text, "reward": reward,
        "metadata": json.loads(metadata_json) if metadata_json else {}})


def read(path: Path) -> list[dict[str, Any]]:
    """The records of a file :func:`write` wrote (or any JSONL or Parquet file of the same columns)."""
    if path.suffix.lower() == ".parquet":
        return list(pq.read_table(path).to_pylist())
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def write(records: list[dict[str, Any]], path: Path, fmt: str) -> None:
    """JSONL (one record a line) or Parquet (the schema above), as ``datasets.load_dataset`` reads them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(records, schema=SCHEMA), path)
        return
    with path.open("w") as f:
        for r in records:
            messages = [{k: v for k, v in m.items() if v is not None} for m in r["messages"]]
            f.write(json.dumps({**r, "messages": messages}, ensure_ascii=False) + "\n")
