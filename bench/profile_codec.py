"""The codec's hot loops alone, for a profiler: the benchmark's own LLM-call spans, encoded or decoded for a
fixed time after a short setup, so the flame graph shows the loop and not the imports.

    py-spy record -r 200 -o codec-encode.svg -- python -m bench.profile_codec encode --seconds 10
"""

from __future__ import annotations

import argparse
import time

from bench.kafka_codec import build_spans, span_variants
from litstream.schemas.codec import Codec
from litstream.schemas.events import EventFactory


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("op", choices=["encode", "decode"])
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to loop")
    args = ap.parse_args(argv)
    codec = Codec()
    spans = build_spans(2000, span_variants(), EventFactory(role="profile"))
    blobs = [codec.encode(s) for s in spans]
    done, deadline = 0, time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        if args.op == "encode":
            for s in spans:
                codec.encode(s)
        else:
            for b in blobs:
                codec.decode(b)
        done += len(spans)
    print(f"{args.op}: {done / args.seconds:,.0f} spans/s")


if __name__ == "__main__":
    main()
