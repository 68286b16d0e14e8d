"""Agent Lightning 0.3.0's own LitAgentRunner (with its OpenTelemetry tracer) against a litstream gateway.

Run by tests/test_agl_compat.py with the Agent Lightning virtualenv's python: ``python agl_runner_script.py URL N``.
The runner claims N rollouts, traces the agent (spans go to the gateway's /v1/traces), emits rewards and reports
success; the script prints what the store then says.
"""

import asyncio
import json
import sys


async def main(url: str, n: int) -> dict:
    import agentlightning as agl
    from agentlightning.store.client_server import LightningStoreClient

    @agl.rollout
    def agent(task: dict, prompt_template: agl.PromptTemplate) -> float:
        with agl.operation(name="solve") as op:
            answer = task["a"] + task["b"]
            op.set_output(prompt_template.format(q=answer))
        agl.emit_message(f"answered {answer}")
        return 1.0 if answer == task["expect"] else 0.0

    store = LightningStoreClient(url, retry_delays=(0.5, 1.0), health_retry_delays=(0.1,))
    await store.add_resources({"prompt": agl.PromptTemplate(template="A: {q}", engine="f-string")})
    ids = [(await store.enqueue_rollout(input={"a": i, "b": 1, "expect": i + 1 if i % 2 == 0 else -1})).rollout_id
           for i in range(n)]

    runner = agl.LitAgentRunner(agl.OtelTracer(), max_rollouts=n, poll_interval=0.2)
    runner.init(agent)
    runner.init_worker(0, store)
    try:
        await asyncio.wait_for(runner.iter(), timeout=120)
    finally:
        runner.teardown_worker(0)
        runner.teardown()

    out = {"statuses": [], "rewards": [], "span_names": []}
    for rid in ids:
        ro = await store.get_rollout_by_id(rid)
        out["statuses"].append(ro.status if ro else None)
        spans = await store.query_spans(rid, attempt_id="latest")
        names = sorted({s.name for s in spans})
        out["span_names"].append(names)
        reward = None
        for s in spans:
            if s.name == "agentlightning.annotation":
                reward = s.attributes.get("agentlightning.reward.0.value")
        out["rewards"].append(reward)
    await store.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2])))))
