"""The policy server on the real broker (and, end to end, the lifecycle processor, span sink with chDB, runner
and triplet processor): the `openai` client against it, streaming and not; spans with the engine's token ids;
a version switch while calls are in flight; an unknown attempt; malformed bodies; a client gone mid-stream."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import SecretStr

from litstream.app.stack import Stack
from litstream.infra import clickhouse, health
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.events import SpanRecorded
from litstream.schemas.policy_versions import UNATTRIBUTED
from litstream.streams.triplet_buffer import Limits
from litstream.streams.triplet_processor import TripletProcessor
from litstream.trainer.engines import TorchEngine
from litstream.workers.agent import litagent
from litstream.workers.client import enqueue_rollout
from litstream.workers.policy_server.backends import torch_backend, upstream_backend
from litstream.workers.runner import Runner
from tests.policy_server_helpers import (
    ServerThread,
    publish_policy,
    spans,
    tiny_backend,
    tiny_checkpoint,
    tiny_engine,
)
from tests.test_triplet_processor import triplets
from tests.waiting import until

MESSAGES: list[Any] = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2+2="}]


def client(server: ServerThread, base: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=base or server.base_url, api_key="unused", max_retries=0, timeout=120)


def post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def greedy(engine: TorchEngine, prompt: list[int], max_tokens: int) -> list[int]:
    return engine.generate([prompt], max_tokens, temperature=0.0)[0].token_ids


def by_response_id(settings: Settings, count: int) -> dict[str, SpanRecorded]:
    def enough() -> list[SpanRecorded] | None:
        found = spans(settings)
        return found if len(found) >= count else None

    found = until(f"{count} spans", enough)
    return {str(s.attributes["gen_ai.response.id"]): s for s in found}


def test_openai_client_streaming_and_not_records_the_engines_tokens(settings: Settings) -> None:
    backend = tiny_backend(seed=0)
    reference = tiny_engine(seed=0)
    with ServerThread(settings, backend) as server:
        c = client(server)
        assert [m.id for m in c.models.list().data] == ["tiny-policy"]
        whole = c.chat.completions.create(model="tiny-policy", messages=MESSAGES, temperature=0, max_tokens=12,
                                          logprobs=True, extra_body={"return_token_ids": True})
        stream = c.chat.completions.create(model="tiny-policy", messages=MESSAGES, temperature=0, max_tokens=12,
                                           stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        text = c.completions.create(model="tiny-policy", prompt="1+1=", temperature=0, max_tokens=6, logprobs=0)
        recorded = by_response_id(settings, 3)

    prompt = backend.chat_prompt([(m["role"], m["content"]) for m in MESSAGES])
    expected = greedy(reference, prompt, 12)
    choice = whole.choices[0]
    assert choice.model_extra and choice.model_extra["token_ids"] == expected
    assert whole.usage is not None and whole.usage.completion_tokens == len(expected)
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert len(choice.logprobs.content) == len(expected)
    # the stream: the same greedy answer piece by piece, then the usage chunk with no choices
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == choice.message.content
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(expected)
    assert text.choices[0].logprobs is not None and len(text.choices[0].logprobs.token_logprobs or []) > 0

    for rid in (whole.id, chunks[0].id):
        span = recorded[rid]
        assert span.rollout_id == UNATTRIBUTED and span.attempt_id == UNATTRIBUTED  # no attempt: no rollout
        a = span.attributes
        assert a["prompt_token_ids"] == prompt and a["response_token_ids"] == expected
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "tiny-policy"
        assert a["gen_ai.prompt.1.role"] == "user" and a["gen_ai.prompt.1.content"] == "2+2="
        assert a["gen_ai.completion.0.content"] == choice.message.content
        assert a["gen_ai.usage.output_tokens"] == len(expected) and a["litstream.policy.version"] == 0
        assert isinstance(a["response_logprobs"], list) and len(a["response_logprobs"]) == len(expected)
    completion_span = recorded[text.id].attributes
    assert completion_span["gen_ai.operation.name"] == "text_completion"
    assert completion_span["response_token_ids"] == greedy(reference, backend.text_prompt("1+1="), 6)


def test_a_version_published_while_a_call_waits_for_the_engine_applies_after_it(settings: Settings,
                                                                               tmp_path: Path) -> None:
    """Deterministic order on the engine's one thread: a held job, then the call, then the switch."""
    v0, v1 = tiny_checkpoint(tmp_path, 0, seed=0), tiny_checkpoint(tmp_path, 1, seed=1)
    backend = torch_backend(TorchEngine.from_checkpoint(v0), "tiny-policy")
    release = threading.Event()
    with ServerThread(settings, backend) as server:
        held = backend._pool.submit(release.wait, 120)  # the engine is busy
        answers: list[Any] = []
        caller = threading.Thread(target=lambda: answers.append(client(server).chat.completions.create(
            model="m", messages=MESSAGES, temperature=0, max_tokens=30)))
        caller.start()
        until("the call queued on the engine", lambda: backend._pool._work_queue.qsize() == 1)
        publish_policy(settings, 1, v1)
        until("the switch queued behind it", lambda: backend._pool._work_queue.qsize() == 2)
        release.set()
        held.result(60)
        caller.join(120)
        until("version 1 served", lambda: backend.version == 1)
        after = client(server).chat.completions.create(model="m", messages=MESSAGES, temperature=0, max_tokens=30)
        recorded = by_response_id(settings, 2)
    [during] = answers
    prompt = backend.chat_prompt([(m["role"], m["content"]) for m in MESSAGES])
    assert during.system_fingerprint == "policy-v0" and after.system_fingerprint == "policy-v1"
    assert recorded[during.id].attributes["litstream.policy.version"] == 0
    assert recorded[during.id].attributes["response_token_ids"] == greedy(TorchEngine.from_checkpoint(v0), prompt, 30)
    assert recorded[after.id].attributes["litstream.policy.version"] == 1
    assert recorded[after.id].attributes["response_token_ids"] == greedy(TorchEngine.from_checkpoint(v1), prompt, 30)


def test_litstream_policy_server_runs_as_a_process_of_the_stack(settings: Settings) -> None:
    with Stack(settings) as stack:
        stack.start("policy-server", "policy-server", "--model", "tiny", "--port", "0")
        stack.wait_ready("policy-server", "policy-server", timeout=120, key="url")
        info = health.read(settings.data_dir, "policy-server")
        assert info is not None
        answer = openai.OpenAI(base_url=info["url"], api_key="unused", max_retries=0).chat.completions.create(
            model="tiny-policy", messages=MESSAGES, max_tokens=4)
        assert answer.model == "tiny-policy" and answer.usage is not None and answer.usage.completion_tokens > 0
        assert until("its span", lambda: [s for s in spans(settings) if s.attributes["gen_ai.response.id"] == answer.id])


def test_langchain_chat_openai_and_plain_http_work_unchanged(settings: Settings) -> None:
    chat_models = pytest.importorskip("langchain_openai")
    with ServerThread(settings, tiny_backend()) as server:
        llm = chat_models.ChatOpenAI(base_url=server.base_url, api_key="unused", model="tiny-policy", max_tokens=6,
                                     temperature=0, max_retries=0)
        reply = llm.invoke("2+2=")
        streamed = "".join(str(chunk.content) for chunk in llm.stream("2+2="))
        status, body = post(server.base_url + "/chat/completions", json.dumps(
            {"model": "tiny-policy", "messages": [{"role": "user", "content": "2+2="}], "max_tokens": 6,
             "temperature": 0}).encode())
        recorded = by_response_id(settings, 3)
    assert status == 200 and body["object"] == "chat.completion"
    assert reply.content == streamed == body["choices"][0]["message"]["content"]  # greedy: the same answer
    assert reply.response_metadata["token_usage"]["completion_tokens"] == body["usage"]["completion_tokens"]
    assert recorded[body["id"]].attributes["gen_ai.completion.0.content"] == reply.content


def test_with_a_token_set_callers_must_send_it_as_their_api_key(settings: Settings) -> None:
    guarded = settings.model_copy(update={"policy_server_token": SecretStr("pk-Secret-7")})
    with ServerThread(guarded, tiny_backend()) as server:
        with pytest.raises(openai.AuthenticationError) as refused:
            client(server).chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
        assert refused.value.code == "invalid_api_key" and "pk-Secret-7" not in str(refused.value)
        good = openai.OpenAI(base_url=server.base_url, api_key="pk-Secret-7", max_retries=0)
        assert good.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2).choices
        assert urllib.request.urlopen(server.root + "/health", timeout=30).status == 200


def test_several_choices_and_a_stop_sequence(settings: Settings) -> None:
    with ServerThread(settings, tiny_backend()) as server:
        c = client(server)
        three = c.chat.completions.create(model="m", messages=MESSAGES, n=3, max_tokens=8, seed=7)
        full = c.completions.create(model="m", prompt="1+1=", temperature=0, max_tokens=12).choices[0].text
        stop = full[4:6]  # greedy again, told to stop at a piece of its own answer
        cut = c.completions.create(model="m", prompt="1+1=", temperature=0, max_tokens=12, stop=[stop]).choices[0]
        recorded = by_response_id(settings, 5)
    assert [ch.index for ch in three.choices] == [0, 1, 2]
    choice_spans = [recorded[f"{three.id}.{i}"] for i in range(3)]
    assert [s.attributes["litstream.choice.index"] for s in choice_spans] == [0, 1, 2]
    assert len({s.sequence_id for s in choice_spans}) == 3  # one id each, reserved together
    assert cut.finish_reason == "stop" and cut.text == full[: full.find(stop)]


def test_errors_come_back_in_openai_format(settings: Settings) -> None:
    with ServerThread(settings, tiny_backend()) as server:
        status, body = post(server.base_url + "/chat/completions", b"{not json")
        assert status == 400 and body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "invalid_json" and "JSON" in body["error"]["message"]
        status, body = post(server.base_url + "/chat/completions", json.dumps({"model": "m"}).encode())
        assert status == 400 and body["error"]["param"] == "messages"
        status, body = post(server.base_url + "/completions", json.dumps(
            {"model": "m", "prompt": [999999]}).encode())
        assert status == 400 and "vocabulary" in body["error"]["message"]
        with pytest.raises(openai.BadRequestError) as bad:
            client(server).chat.completions.create(model="m", messages=MESSAGES, temperature=7)
        assert bad.value.status_code == 400 and "temperature" in str(bad.value)
        with pytest.raises(openai.BadRequestError, match="context"):
            client(server).completions.create(model="m", prompt="x" * 300, max_tokens=10)
        # an attempt nobody started: refused (404), nothing recorded under it
        unknown = f"{server.root}/rollout/ro-nope/attempt/at-nope/v1"
        with pytest.raises(openai.NotFoundError) as missing:
            client(server, unknown).chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
        assert missing.value.code == "attempt_not_found"
        status, body = post(server.root + "/v2/anything", b"{}")
        assert status == 404 and "/v1/chat/completions" in body["error"]["message"]
        # the server still serves
        ok = client(server).chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
        assert ok.choices[0].finish_reason in ("stop", "length")
    assert all(s.rollout_id == UNATTRIBUTED for s in spans(settings))


def test_a_client_that_disconnects_mid_stream_does_not_stop_the_server(settings: Settings) -> None:
    with ServerThread(settings, tiny_backend()) as server:
        # 8 choices of 200 tokens: about a megabyte of chunks, more than the sockets hold, so the server is still
        # writing when the client resets the connection
        body = json.dumps({"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 200, "n": 8,
                           "temperature": 1.0}).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.running.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        seen = b""
        while b"data: " not in seen:  # the stream started; then go away without reading the rest
            more = sock.recv(4096)
            assert more, "the server closed the stream"
            seen += more
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
        after = client(server).chat.completions.create(model="m", messages=MESSAGES, max_tokens=3)
        assert after.choices[0].message.content is not None

        def all_choices_cut() -> list[Any] | None:  # the n choices' spans leave one by one: wait for them all
            errors = [s for s in spans(settings) if s.status_code == "ERROR"]
            return errors if len(errors) >= 8 else None

        cut = until("the cut call recorded", all_choices_cut)
    # the tokens were sampled: the spans keep them, marked as not all delivered
    assert len(cut) == 8 and all(s.attributes["litstream.stream.disconnected"] is True for s in cut)
    assert "disconnected" in str(cut[0].status_message)
    assert all(len(s.attributes["response_token_ids"]) > 0 for s in cut)  # type: ignore[arg-type]


def test_a_version_switch_fails_no_call_and_each_span_names_its_version(settings: Settings, tmp_path: Path) -> None:
    v0, v1 = tiny_checkpoint(tmp_path, 0, seed=0), tiny_checkpoint(tmp_path, 1, seed=1)
    backend = torch_backend(TorchEngine.from_checkpoint(v0), "tiny-policy")
    with ServerThread(settings, backend) as server:
        c = client(server)
        # a stream opened on version 0 and left half-read while version 1 is published
        stream = c.chat.completions.create(model="m", messages=MESSAGES, temperature=0, max_tokens=20, stream=True)
        first = next(iter(stream))
        answers: list[Any] = []
        errors: list[BaseException] = []

        def ask() -> None:
            try:
                answers.append(c.chat.completions.create(model="m", messages=MESSAGES, temperature=0, max_tokens=40))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        callers = [threading.Thread(target=ask) for _ in range(4)]
        for t in callers:
            t.start()
        publish_policy(settings, 1, v1)
        for t in callers:
            t.join(120)
        rest = list(stream)
        until("version 1 served", lambda: backend.version == 1)
        after = c.chat.completions.create(model="m", messages=MESSAGES, temperature=0, max_tokens=40)
        recorded = by_response_id(settings, 6)
    assert not errors and len(answers) == 4
    assert first.system_fingerprint == "policy-v0" and rest[-1].choices[0].finish_reason in ("stop", "length")
    assert after.system_fingerprint == "policy-v1"
    prompt = backend.chat_prompt([(m["role"], m["content"]) for m in MESSAGES])
    engines = {0: TorchEngine.from_checkpoint(v0), 1: TorchEngine.from_checkpoint(v1)}
    for answer in [*answers, after]:
        version = int(str(answer.system_fingerprint).removeprefix("policy-v"))
        span = recorded[answer.id]
        assert span.attributes["litstream.policy.version"] == version
        assert span.attributes["response_token_ids"] == greedy(engines[version], prompt, 40)
    assert recorded[first.id].attributes["litstream.policy.version"] == 0


def test_forwarding_to_an_openai_compatible_upstream_keeps_its_token_ids(settings: Settings, tmp_path: Path) -> None:
    """The upstream backend asks for token ids and log-probs the way vLLM is asked; here the upstream is another
    policy server on the torch engine (vLLM itself needs its own virtualenv, see test_engines.py)."""
    v0 = tiny_checkpoint(tmp_path, 0, seed=0)
    with ServerThread(settings, torch_backend(TorchEngine.from_checkpoint(v0), "tiny-policy")) as upstream:
        front = upstream_backend(upstream.base_url, "tiny-policy", v0, model_name="front")
        with ServerThread(settings, front) as server:
            answer = client(server).chat.completions.create(model="front", messages=MESSAGES, temperature=0,
                                                            max_tokens=10)
            streamed = list(client(server).chat.completions.create(model="front", messages=MESSAGES,
                                                                    temperature=0, max_tokens=10, stream=True))
            recorded = by_response_id(settings, 4)  # two calls, each recorded by both servers
            publish_policy(settings, 1, v0)
            until("the upstream's new version recorded", lambda: front.version == 1)
    prompt = front.chat_prompt([(m["role"], m["content"]) for m in MESSAGES])
    expected = greedy(TorchEngine.from_checkpoint(v0), prompt, 10)
    assert answer.model == "front" and answer.system_fingerprint == "policy-v0"
    span = recorded[answer.id].attributes
    assert span["prompt_token_ids"] == prompt and span["response_token_ids"] == expected
    assert len(span["response_logprobs"]) == len(expected)  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == answer.choices[0].message.content


@pytest.mark.slow(enabled_by="LITSTREAM_SMOLLM2")
def test_smollm2_is_served_with_its_tokenizers_chat_template(settings: Settings) -> None:
    from litstream.trainer.policy import load_smollm2

    policy = load_smollm2()  # the first load dequantises the GGUF (~20 s), later ones read the export
    engine = TorchEngine(policy.model, policy.tokenizer, 0)
    backend = torch_backend(engine, "smollm2-policy")
    question = [{"role": "user", "content": "What is 2+2?"}]
    prompt = backend.chat_prompt([("user", "What is 2+2?")])
    template = policy.tokenizer.tok.apply_chat_template(question, add_generation_prompt=True,  # type: ignore[attr-defined]
                                                        tokenize=True)
    assert prompt == list(template)
    with ServerThread(settings, backend) as server:
        answer = client(server).chat.completions.create(model="smollm2-policy", messages=question, temperature=0,
                                                        max_tokens=8)
        recorded = by_response_id(settings, 1)
    expected = greedy(engine, prompt, 8)
    assert recorded[answer.id].attributes["response_token_ids"] == expected
    assert answer.choices[0].message.content == policy.tokenizer.decode(expected)


@litagent
def openai_agent(task: dict[str, Any], llm: Any) -> float:
    """An agent written the usual way: the `openai` client at the URL it is given, no litstream code."""
    c = openai.OpenAI(base_url=llm.endpoint, api_key="unused", max_retries=0, timeout=120)
    answer = c.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["q"]}],
                                       max_tokens=8, temperature=1.0)
    return 1.0 if (answer.choices[0].message.content or "").strip() else 0.5


def test_an_agents_calls_reach_clickhouse_and_become_triplets(pipeline: Settings, tmp_path: Path) -> None:
    settings = pipeline
    v0 = tiny_checkpoint(tmp_path, 0, seed=0)
    backend = torch_backend(TorchEngine.from_checkpoint(v0), "tiny-policy")
    processor = TripletProcessor(settings, limits=Limits(settle_ms=300), poll_s=0.05)
    processing = threading.Thread(target=processor.run, daemon=True)
    processing.start()
    runner = Runner(settings, openai_agent, concurrency=2)
    with ServerThread(settings, backend, publish=True) as server:
        publish_policy(settings, 0, v0)
        assert server.running.follower is not None
        until("the server published itself", lambda: server.running.follower.published)  # type: ignore[union-attr]
        threading.Thread(target=runner.run, daemon=True).start()
        events = EventProducer(settings, role="test")
        rids = [enqueue_rollout(events, {"q": f"{i}+{i}="}, resources_id="policy-v0").rollout_id for i in range(2)]
        events.flush()
        def all_triplets() -> Any:
            made = triplets(settings)
            return made if {e.rollout_id for _, e in made} >= set(rids) else None

        found = until("a triplet per rollout", all_triplets, timeout=180)
        runner.stop_event.set()
    processor.stop_event.set()
    processing.join(60)
    processor.close()
    calls = {s.rollout_id: s for s in spans(settings) if s.name.startswith("chat ")}
    for _, t in found:
        span = calls[t.rollout_id]
        assert span.attempt_id == t.attempt_id and span.rollout_id in rids
        assert t.prompt_token_ids == span.attributes["prompt_token_ids"]
        assert t.response_token_ids == span.attributes["response_token_ids"]
        assert t.reward in (1.0, 0.5) and t.policy_version == "0"
    in_clickhouse = until("the calls' spans in ClickHouse", lambda: int(clickhouse.query(
        settings.resolved_clickhouse_dsn, "SELECT count() FROM spans FINAL WHERE SpanName LIKE 'chat %' AND "
        f"rollout_id IN ({', '.join(repr(r) for r in rids)})").rows[0][0]) >= 2 or None)
    assert in_clickhouse
