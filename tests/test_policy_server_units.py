"""The policy server's pure parts: request validation, stop sequences, stream chunks, the plain chat template."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from litstream.trainer.engines import Generation
from litstream.trainer.tokenizer import ByteTokenizer
from litstream.workers.policy_server.backends import cut_at_stop, plain_chat_template, truncate
from litstream.workers.policy_server.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    validation_error,
)
from litstream.workers.policy_server.responses import Call, stream_chunks, text_deltas

TOK = ByteTokenizer()


def generation(text: str, finish: str = "length") -> Generation:
    ids = TOK.encode(text, add_bos=False)
    return Generation([1, 2], ids, [-0.5] * len(ids), TOK.decode(ids), finish)


def test_requests_validate_as_openai_does() -> None:
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]}],
        "frequency_penalty": 0.5, "tools": []})  # unknown fields are accepted
    assert req.messages[0].text() == "a" and req.max_new_tokens(7) == 7
    assert CompletionRequest.model_validate({"model": "m", "prompt": ["only"]}).prompt == "only"
    assert CompletionRequest.model_validate({"model": "m", "prompt": [[5, 6]]}).prompt == [5, 6]
    for bad in ({"model": "m", "prompt": ["a", "b"]}, {"model": "m", "prompt": ""},
                {"model": "m", "prompt": "x", "echo": True}, {"model": "m", "prompt": "x", "stop": list("abcde")},
                {"model": "m", "prompt": "x", "n": 0}, {"prompt": "x"}):
        with pytest.raises(ValidationError) as exc:
            CompletionRequest.model_validate(bad)
        error = validation_error(exc.value)
        assert error.status == 400 and error.body()["error"]["type"] == "invalid_request_error"
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "wizard", "content": "x"}]})


def test_stop_sequences_cut_the_text_before_them_and_keep_the_tokens_up_to_them() -> None:
    gen = generation("hello world, bye")
    cut = cut_at_stop(gen, [",", "zzz"], TOK)
    assert cut.text == "hello world" and cut.finish_reason == "stop"
    assert TOK.decode(cut.token_ids) == "hello world," and len(cut.logprobs) == len(cut.token_ids)
    assert cut_at_stop(gen, ["zzz"], TOK) is gen
    short = truncate(gen, 5, TOK)
    assert short.text == "hello" and short.finish_reason == "length" and len(short.logprobs) == 5


def test_stream_pieces_join_to_the_answer_even_inside_multibyte_characters() -> None:
    gen = generation("añb€")  # 'ñ' is 2 bytes, '€' 3: byte tokens end inside them
    deltas = text_deltas(gen, TOK.decode)
    assert "".join(deltas) == gen.text and len(deltas) == len(gen.token_ids)
    assert "\ufffd" not in "".join(deltas)


def test_stream_chunks_carry_role_tokens_finish_and_usage() -> None:
    call = Call("chat", "chatcmpl-1", 0, "m", "m", [1, 2], [("user", "q")], [generation("ok", "stop")], 3,
                logprobs=True, token_ids=True)
    chunks = list(stream_chunks(call, TOK.decode, include_usage=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tokens = chunks[1:-2]
    assert [c["choices"][0]["delta"]["content"] for c in tokens] == ["o", "k"]
    assert [c["choices"][0]["token_ids"] for c in tokens] == [[ord("o")], [ord("k")]]
    assert tokens[0]["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2
    assert all(c["system_fingerprint"] == "policy-v3" for c in chunks)


def test_the_plain_chat_template_ends_with_the_assistants_turn() -> None:
    text = plain_chat_template([("developer", "be brief"), ("user", "2+2=")])
    assert text == "<|system|>\nbe brief\n<|user|>\n2+2=\n<|assistant|>\n"
