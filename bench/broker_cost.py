"""What a record costs the embedded broker's CPU, by how many consumers tail its partitions and by how many batches
its partition already holds (docs/benchmarks.md, "Group commit of the processor's outputs ...").

One producer writes a 300-byte record every ~1.3 ms, each its own batch (acknowledged before the next), into a
4-partition topic of a fresh embedded broker, while N consumers tail every partition with a 10 ms fetch wait; the
broker's CPU time comes from /proc. Then the same after many more one-record batches were written to that topic.

    python -m litstream.bench.broker_cost [--records 2000] [--readers 0 1 4] [--backlog 10000]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from litstream.infra.broker import EmbeddedBroker

from .processes import cpu_seconds

PARTITIONS = 4


@contextmanager
def tailing(bootstrap: str, topic: str, readers: int) -> Iterator[None]:
    """``readers`` consumers (threads) reading every partition of ``topic`` from its end while the block runs."""
    stop = threading.Event()

    def tail(i: int) -> None:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"tail-{i}", "fetch.wait.max.ms": 10})
        c.assign([TopicPartition(topic, p, -1) for p in range(PARTITIONS)])  # -1: the end
        while not stop.is_set():
            c.poll(0.1)
        c.close()

    threads = [threading.Thread(target=tail, args=(i,), daemon=True) for i in range(readers)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # let them join and reach the end
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()


def cost_per_record(broker: EmbeddedBroker, producer: Producer, topic: str, records: int) -> float:
    """Microseconds of broker CPU per record, each record produced and acknowledged on its own."""
    assert broker.proc is not None
    before = cpu_seconds(broker.proc.pid) or 0.0
    for i in range(records):
        producer.produce(topic, key=str(i).encode(), value=b"x" * 300)
        producer.flush()
        time.sleep(0.001)
    return 1e6 * ((cpu_seconds(broker.proc.pid) or 0.0) - before) / records


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2000, help="records timed per row")
    ap.add_argument("--readers", type=int, nargs="+", default=[0, 1, 4], help="tailing consumers, one row each")
    ap.add_argument("--backlog", type=int, default=10_000, help="one-record batches added before the last row")
    args = ap.parse_args(argv)
    with EmbeddedBroker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept: its futures die with it
        admin.create_topics([NewTopic("cost", PARTITIONS, 1)])["cost"].result()
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "enable.idempotence": True,
                             "acks": "all"})
        for readers in args.readers:
            with tailing(broker.bootstrap, "cost", readers):
                us = cost_per_record(broker, producer, "cost", args.records)
            print(f"{readers} tailing consumer(s): {us:,.0f} us of broker CPU per record", flush=True)
        for i in range(args.backlog):  # many small batches held by the same partitions
            producer.produce("cost", key=str(i).encode(), value=b"y" * 100)
            producer.flush()
        with tailing(broker.bootstrap, "cost", 1):
            us = cost_per_record(broker, producer, "cost", args.records)
        held = (args.backlog + args.records * len(args.readers)) // PARTITIONS
        print(f"1 tailing consumer, ~{held:,} batches per partition: {us:,.0f} us of broker CPU per record")


if __name__ == "__main__":
    main()
