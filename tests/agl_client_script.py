"""Drives Agent Lightning 0.3.0's stock LightningStoreClient against a litstream gateway.

Run by tests/test_agl_compat.py with the Agent Lightning virtualenv's python: ``python agl_client_script.py URL``.
Prints one JSON object of observations for the test to check.
"""

import asyncio
import json
import sys
import time


async def main(url: str) -> dict:
    from agentlightning.store.client_server import LightningStoreClient
    from agentlightning.types import LLM, PromptTemplate, RolloutConfig, Span, TraceStatus
    from agentlightning.types.tracer import OtelResource

    client = LightningStoreClient(url, retry_delays=(0.5,), health_retry_delays=(0.1,))
    out: dict = {}
    try:
        res = await client.add_resources({"main_llm": LLM(endpoint="http://127.0.0.1:9/v1", model="policy-v1")})
        out["resources_version"] = res.version
        upd = await client.update_resources(res.resources_id, {"prompt": PromptTemplate(template="Q: {q}",
                                                                                         engine="f-string")})
        out["resources_updated_version"] = upd.version
        latest = await client.get_latest_resources()
        out["latest_resources_is_updated"] = latest is not None and latest.resources_id == res.resources_id

        ro = await client.enqueue_rollout(input={"q": 1}, mode="train",
                                          config=RolloutConfig(max_attempts=2, retry_condition=["failed"]))
        out["enqueued_status"] = ro.status
        out["stamped_resources"] = ro.resources_id == res.resources_id

        claimed = None
        for _ in range(50):
            claimed = await client.dequeue_rollout(worker_id="agl-worker")
            if claimed is not None:
                break
            await asyncio.sleep(0.2)
        out["dequeued"] = claimed is not None and claimed.rollout_id == ro.rollout_id
        aid = claimed.attempt.attempt_id
        out["attempt_status"] = claimed.attempt.status

        seq = await client.get_next_span_sequence_id(ro.rollout_id, aid)
        now = time.time()
        span = Span(rollout_id=ro.rollout_id, attempt_id=aid, sequence_id=seq, trace_id="a" * 32, span_id="b" * 16,
                    parent_id=None, name="agentlightning.annotation",
                    status=TraceStatus(status_code="OK"),
                    attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 1.0},
                    events=[], links=[], start_time=now, end_time=now, context=None, parent=None,
                    resource=OtelResource(attributes={}, schema_url=""))
        added = await client.add_span(span)
        out["span_added"] = added is not None and added.span_id == "b" * 16
        out["duplicate_span_is_none"] = (await client.add_span(span)) is None
        spans = await client.query_spans(ro.rollout_id, attempt_id="latest")
        out["spans"] = [(s.name, s.sequence_id, s.attributes.get("agentlightning.reward.0.value")) for s in spans]

        att = await client.update_attempt(ro.rollout_id, aid, status="succeeded")
        out["attempt_after"] = att.status
        done = await client.wait_for_rollouts(rollout_ids=[ro.rollout_id, "ro-unknown"], timeout=0)
        out["waited"] = [r.status for r in done]
        out["unknown_rollout_is_none"] = (await client.get_rollout_by_id("ro-doesnotexist")) is None
        got = await client.get_rollout_by_id(ro.rollout_id)
        out["got_rollout_has_attempt"] = getattr(got, "attempt", None) is not None

        page = await client.query_rollouts(status_in=["succeeded"])
        out["query_total"] = page.total
        attempts = await client.query_attempts(ro.rollout_id)
        out["attempts"] = [a.status for a in attempts]

        started = await client.start_rollout(input={"q": 2}, worker_id="agl-worker-2")
        out["started_status"] = started.status
        w2 = await client.get_worker_by_id("agl-worker-2")  # read-your-writes: the worker record follows at once
        out["worker_after_start"] = None if w2 is None else [w2.status, w2.current_attempt_id == started.attempt.attempt_id]
        again = await client.start_attempt(started.rollout_id, worker_id="agl-worker-3")
        out["second_attempt_seq"] = again.attempt.sequence_id
        w3 = await client.get_worker_by_id("agl-worker-3")
        out["worker_after_attempt"] = None if w3 is None else w3.current_attempt_id == again.attempt.attempt_id
        meta = await client.update_rollout(started.rollout_id, metadata={"k": "v"})
        out["metadata_updated"] = meta.metadata == {"k": "v"}
        try:  # the stock flow: the attempt succeeded (above), then the rollout: its own status again, a no-op
            again_latest = await client.update_attempt(ro.rollout_id, "latest", status="succeeded")
            finished = await client.update_rollout(ro.rollout_id, status="succeeded")
            out["finished_again"] = [again_latest.status, finished.status, finished.end_time is not None]
        except Exception as exc:  # 4xx: the client raises at once
            out["finished_again"] = f"refused: {exc}"
        by_parent = await client.query_spans(ro.rollout_id, sort_by="parent_id")  # a field of Span, as the reference
        out["spans_by_parent"] = len(by_parent)

        worker = await client.update_worker("agl-worker", heartbeat_stats={"cpu": 0.5})
        out["worker_stats"] = worker.heartbeat_stats
        workers = await client.query_workers()
        out["workers"] = sorted(w.worker_id for w in workers)
        stats = await client.statistics()
        out["total_rollouts"] = stats.get("total_rollouts")
        out["total_spans"] = stats.get("total_spans")
    finally:
        await client.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
