"""A call that names no sampling parameter samples with the served policy's defaults (the published ones once a
version is published), /v1/models says which, and the span records what was used; a call that names them is
honoured. On the real broker, through the `openai` client."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import openai

from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.events import NamedResourceRecord, ResourcesPublished
from litstream.schemas.policy_versions import POLICY_RESOURCE, policy_resources_id
from litstream.workers.policy_server.sampling_defaults import (
    SamplingDefaults,
    generation_config_defaults,
    initial_defaults,
)
from tests.policy_server_helpers import ServerThread, spans, tiny_backend, tiny_checkpoint
from tests.waiting import until


def _models(server: ServerThread) -> dict[str, object]:
    with urllib.request.urlopen(server.base_url + "/models", timeout=30) as resp:
        return json.loads(resp.read())["data"][0]["litstream_sampling_defaults"]  # type: ignore[no-any-return]


def _publish(settings: Settings, version: int, checkpoint: Path, sampling: dict[str, object]) -> None:
    events = EventProducer(settings, role="test-trainer")
    now = time.time()
    events.send(events.topics.resources, ResourcesPublished(
        **events.factory.stamp(), resources_id=policy_resources_id(version), version=1, create_time=now,
        update_time=now, resources={POLICY_RESOURCE: NamedResourceRecord(
            resource_type="llm", endpoint=f"torch://{checkpoint}", model="tiny-policy", engine="torch",
            version=version, checkpoint=str(checkpoint), sampling_parameters=sampling)}))
    events.flush()


def _request_params(settings: Settings, response_id: str) -> dict[str, object]:
    for s in spans(settings):
        a = s.attributes
        if a.get("gen_ai.response.id") == response_id:
            return {k.removeprefix("gen_ai.request."): v for k, v in a.items() if k.startswith("gen_ai.request.")} \
                | {"defaulted": a.get("litstream.sampling.defaulted")}
    return {}


def test_calls_without_sampling_parameters_follow_the_published_policy(settings: Settings, tmp_path: Path) -> None:
    with ServerThread(settings, tiny_backend(), sampling=initial_defaults("tiny")) as server:
        assert _models(server) == {"temperature": 1.0, "top_p": 1.0, "max_tokens": 3,
                                   "source": "the tiny policy's defaults"}
        _publish(settings, 1, tiny_checkpoint(tmp_path, 1, seed=1), {"temperature": 0.5, "max_tokens": 5})
        until("the published defaults", lambda: _models(server)["temperature"] == 0.5)
        c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        plain = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "2+2="}])
        named = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "2+2="}],
                                          temperature=1.2, top_p=1.0, max_tokens=2)
        used = until("the plain call's span", lambda: _request_params(settings, plain.id))
        assert (used["temperature"], used["top_p"], used["max_tokens"]) == (0.5, 1.0, 5)
        assert used["defaulted"] == ["temperature", "top_p", "max_tokens"]
        honoured = until("the named call's span", lambda: _request_params(settings, named.id))
        assert (honoured["temperature"], honoured["max_tokens"], honoured["defaulted"]) == (1.2, 2, None)


def test_a_model_directory_names_its_defaults_in_its_generation_config(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9,
                                                                 "max_new_tokens": 64}))
    d = generation_config_defaults(tmp_path)
    assert (d.temperature, d.top_p, d.max_tokens) == (0.6, 0.9, 64) and d.source.endswith("generation_config.json")
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.6}))
    assert generation_config_defaults(tmp_path) == SamplingDefaults()  # greedy by default names no temperature
    assert initial_defaults("smollm2").temperature == 0.5
    assert SamplingDefaults().merged({"temperature": 7.0, "top_p": "x"}, "bad") == SamplingDefaults()
