"""The side-by-side table: each figure of the targets, litstream beside Agent Lightning 0.3.0 from the same run,
with the ratio and the target (issue 21). Rows are found by the start of their label in the benchmarks' reports;
a benchmark that did not run leaves its figures blank."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from .harness import AGL_REQUIREMENT, Report, Row

AGL = AGL_REQUIREMENT.replace("==", " ")
CODEC_MIN_RATIO = 1 / 1.3  # the codec's rate at least this share of bare fastavro's: its time within 1.3x


@dataclass(frozen=True)
class Figure:
    what: str
    litstream: str  # label prefix of litstream's row
    reference: str | None  # label prefix of the baseline's row; None: the reference has no such part
    min_rate: float | None = None  # target, per second
    min_ratio: float | None = None  # target, litstream / reference
    max_ratio: float | None = None  # target for a cost (lower is better), litstream / reference
    max_value: float | None = None  # target for a cost in the row's own unit (lower is better)
    unit: str = ""  # of max_value, for the target's text


FIGURES: tuple[Figure, ...] = (
    # The codec against bare fastavro on the same records and schema (its "reference"): within 1.3x of its time
    *(Figure(f"codec {verb} {what} (events/s; reference: bare fastavro)", f"codec {verb} {what}",
             f"fastavro {verb} {what}", min_ratio=CODEC_MIN_RATIO)
      for what in ("SpanRecorded", "RolloutEnqueued") for verb in ("encode", "decode")),
    *(Figure(f"codec {verb}{path}, the record type furthest from fastavro (events/s)",
             f"codec {verb}{path}, the type furthest from fastavro", f"fastavro {verb}, the type furthest from the codec{path}",
             min_ratio=CODEC_MIN_RATIO)
      for path in ("", " records") for verb in ("encode", "decode")),
    Figure("replay (events/s; reference: the same operations through its API)", "litstream replay (",
           f"{AGL} InMemory: apply the same operations", min_rate=100_000),
    Figure("stock client's agent loop, 16 agents (rollouts/s)", "litstream agent loop (stock LightningStoreClient "
           "-> gateway /v1/agl), 16 agents", f"{AGL} agent loop (same client -> LightningStoreServer over InMemory), "
           "16 agents", min_ratio=1.5),
    Figure("stock client's agent loop, 1 agent (rollouts/s)", "litstream agent loop (stock LightningStoreClient "
           "-> gateway /v1/agl), 1 agent", f"{AGL} agent loop (same client -> LightningStoreServer over InMemory), "
           "1 agent"),
    # CPU per rollout of each server's process tree: the cost that carries over to larger machines (lower is better)
    *(Figure(f"agent loop, {agents}: CPU-ms per rollout{which}", f"{side} agent loop CPU-ms per rollout, {agents}",
             f"{AGL} agent loop CPU-ms per rollout, {agents}", max_ratio=most)
      for agents in ("16 agents", "1 agent")
      for side, which, most in (("litstream", ", every process (broker's JVM included)", 1.5),
                                ("litstream, the broker's JIT compiler apart",
                                 ", every process, less a fresh broker's JIT compiling", 1.5),
                                ("litstream without the broker", " without the broker", 1.0))),
    # A timed-out attempt as readers see it (the store's replica), with nobody calling; the reference's check runs
    # only at a call, here with its scan on every call (scan_debounce_seconds=0) and a call every 50 ms
    Figure("timer: a timeout visible to readers, p99 ms past the deadline", "litstream timeout visible",
           f"{AGL} InMemory, scan_debounce_seconds=0", max_value=50, unit=" ms"),
    Figure("rollout cycles, 64 in flight (cycles/s)", "litstream cycles, 64 calls", f"{AGL} InMemory cycles, 64",
           min_rate=2_000),
    Figure("rollout cycles, 1 in flight (cycles/s)", "litstream cycles, 1 call", f"{AGL} InMemory cycles, seq"),
    Figure("enqueue_many_rollouts (rollouts/s)", "litstream enqueue_many_rollouts(",
           f"{AGL} InMemory enqueue_many_rollouts(", min_rate=20_000),
    Figure("spans into SQL from the SDK (spans/s; reference: in-process add_otel_span)",
           "litstream SDK exporter: visible in ClickHouse", f"{AGL} InMemory add_otel_span", min_rate=50_000),
    Figure("OTLP/HTTP /v1/traces (spans/s)", "litstream OTLP/HTTP exporter -> gateway",
           f"{AGL} server OTLP/HTTP", min_ratio=2.0),
    Figure("REST add_span, 1 in flight (spans/s)", "litstream REST add_span (stock LightningStoreClient -> gateway "
           "/v1/agl), 1 in", f"{AGL} server REST add_span (same client), 1 in", min_ratio=2.0),
    Figure("REST add_span, 16 in flight (spans/s)", "litstream REST add_span (stock LightningStoreClient -> gateway "
           "/v1/agl), 16 in", f"{AGL} server REST add_span (same client), 16 in", min_ratio=2.0),
)


def _find(reports: dict[str, Report], prefix: str | None) -> float | None:
    if prefix is None:
        return None
    for report in reports.values():
        for row in report.rows:
            if row.what.startswith(prefix) and (row.msgs_per_s is not None or row.value is not None):
                return row.msgs_per_s if row.msgs_per_s is not None else row.value
    return None


@dataclass
class Line:
    what: str
    litstream: float | None
    reference: float | None
    target: str
    met: bool | None  # None: not measured in this run

    @property
    def ratio(self) -> float | None:
        if self.litstream is None or not self.reference:
            return None
        return self.litstream / self.reference


def _line(figure: Figure, reports: dict[str, Report]) -> Line:
    lit, ref = _find(reports, figure.litstream), _find(reports, figure.reference)
    target, met = "", None
    if figure.min_rate is not None:
        target = f">= {figure.min_rate:,.0f}/s"
        met = None if lit is None else lit >= figure.min_rate
    elif figure.min_ratio is not None:
        target = f">= {figure.min_ratio:.2g}x reference"
        met = None if lit is None or not ref else lit / ref >= figure.min_ratio
    elif figure.max_value is not None:
        target = f"<= {figure.max_value:g}{figure.unit}"
        met = None if lit is None else lit <= figure.max_value
    elif figure.max_ratio is not None:
        target = f"<= {figure.max_ratio:g}x reference"
        met = None if lit is None or not ref else lit / ref <= figure.max_ratio
    return Line(figure.what, lit, ref, target, met)


def summary(reports: dict[str, Report]) -> list[Line]:
    """One line per figure that at least one side measured in this run."""
    lines = [_line(f, reports) for f in FIGURES]
    return [ln for ln in lines if ln.litstream is not None or ln.reference is not None]


def _fmt(value: float | None, digits: int | None = None, suffix: str = "") -> str:
    """``digits`` None: whole numbers from 100 up, one decimal below (CPU-ms, a few rollouts/s)."""
    if value is None:
        return "-"
    places = digits if digits is not None else (0 if abs(value) >= 100 else 1)
    return f"{value:,.{places}f}{suffix}"


def _met(met: bool | None) -> str:
    return {True: "yes", False: "no", None: "-"}[met]


def print_summary(console: Console, lines: list[Line]) -> None:
    table = Table(title=f"litstream beside {AGL}, one run (rates per second, costs in CPU-ms; ratio = litstream / "
                        "reference)",
                  title_justify="left")
    for name, justify in (("figure", "left"), ("litstream", "right"), (AGL, "right"), ("ratio", "right"),
                          ("target", "left"), ("met", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for ln in lines:
        table.add_row(ln.what, _fmt(ln.litstream), _fmt(ln.reference), _fmt(ln.ratio, 2, "x"), ln.target,
                      _met(ln.met))
    console.print(table)


def markdown(lines: list[Line]) -> str:
    out = [f"| figure | litstream | {AGL} | ratio | target | met |", "|---|---:|---:|---:|---|---|"]
    out += [f"| {ln.what} | {_fmt(ln.litstream)} | {_fmt(ln.reference)} | {_fmt(ln.ratio, 2, 'x')} | "
            f"{ln.target} | {_met(ln.met)} |" for ln in lines]
    return "\n".join(out) + "\n"


def rows_of(lines: list[Line]) -> list[Row]:
    """The summary as rows, for the saved JSON."""
    return [Row(ln.what, ln.litstream, note=f"reference {_fmt(ln.reference)}; ratio {_fmt(ln.ratio, 2, 'x')}; "
                                              f"target {ln.target or 'none'}; met {_met(ln.met)}") for ln in lines]
