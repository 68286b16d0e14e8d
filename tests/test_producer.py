"""EventProducer.send_now on the real broker: records leave at once however long the linger, and close ends the
thread that sends them."""

from __future__ import annotations

import time
from typing import Any

from litstream.infra.kafka import read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings

LONG_LINGER_MS = 240_000  # four minutes: without send_now nothing below would be delivered within the test


def test_send_now_delivers_without_waiting_out_the_linger(settings: Settings) -> None:
    events = EventProducer(settings, "test", **{"linger.ms": LONG_LINGER_MS, "message.timeout.ms": 2 * LONG_LINGER_MS})
    delivered: list[Any] = []
    try:
        # Warm: the first record waits for metadata and a producer id, longer than one send_now lasts.
        events.produce_raw(events.topics.workers, b"w-0", b"warm")
        events.flush()
        events.produce_raw(events.topics.workers, b"w-1", b"value",
                           on_delivery=lambda err, msg: delivered.append(err or msg.offset()))
        events.send_now()
        deadline = time.monotonic() + 30
        while not delivered and time.monotonic() < deadline:
            events.poll(0.1)
        assert delivered and isinstance(delivered[0], int), f"not delivered: {delivered}"
        assert [m.value() for m in read_to_end(settings, events.topics.workers)] == [b"warm", b"value"]
    finally:
        events.close()


def test_send_now_coalesces_requests_and_close_ends_its_thread(settings: Settings) -> None:
    events = EventProducer(settings, "test", **{"linger.ms": LONG_LINGER_MS, "message.timeout.ms": 2 * LONG_LINGER_MS})
    for i in range(50):
        events.produce_raw(events.topics.workers, f"w-{i}".encode(), b"v")
        events.send_now()  # many asks while a send is under way make one more send, not fifty threads
    sender = events._sender
    assert sender is not None and sender.is_alive()
    events.close()  # flushes what is left, then the helper thread sees the close
    assert not sender.is_alive()
    assert len(list(read_to_end(settings, events.topics.workers))) == 50


def test_a_patient_flush_ends_when_the_producer_gives_up_on_its_messages(settings: Settings) -> None:
    # No broker behind the address: a patient flush (processors) waits for the producer's own delivery timeout,
    # and the failed deliveries surface as an error rather than a hang or a silent loss.
    gone = settings.model_copy(update={"bootstrap_servers": "127.0.0.1:9"})
    events = EventProducer(gone, "test", **{"message.timeout.ms": 1500})
    events.produce_raw(events.topics.workers, b"w-0", b"value")
    try:
        events.flush(None)
    except RuntimeError as exc:
        assert "not delivered" in str(exc)
    else:
        raise AssertionError("a message no broker took was reported delivered")
    finally:
        events.close()
