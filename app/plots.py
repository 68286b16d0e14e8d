"""``litstream report --plot DIR``: the report's curves as PNG files and one self-contained HTML page.

matplotlib with the Agg backend (no display needed); the HTML embeds the PNGs as data URIs, so the page can be
mailed or attached as one file.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # before pyplot: files only, never a window

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from litstream.schemas.policy_versions import resources_order

from .report import Report, Section, cell


def _t(bucket: str) -> dt.datetime:
    return dt.datetime.strptime(bucket, "%Y-%m-%d %H:%M:%S")


def _elapsed(ts: list[dt.datetime], start: dt.datetime, end: dt.datetime | None = None) -> tuple[np.ndarray, str]:
    """Times as elapsed time since ``start``, in the unit that fits up to ``end`` (default the latest of ``ts``):
    s, min or h; and the axis label. Series sharing an axis pass the same ``start`` and ``end``."""
    seconds = np.array([(t - start).total_seconds() for t in ts], dtype=float)
    span = (end - start).total_seconds() if end is not None else float(seconds.max()) if len(seconds) else 0.0
    unit, scale = ("h", 3600.0) if span > 3 * 3600 else ("min", 60.0) if span > 300 else ("s", 1.0)
    return seconds / scale, f"elapsed since {start:%Y-%m-%d %H:%M:%S} UTC ({unit})"


def _legend_outside(ax: Any, **kwargs: Any) -> None:
    """The legend right of the axes, never over the data (savefig's tight bbox keeps it in the image)."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, **kwargs)


def _label(resources_id: str) -> str:
    return resources_id or "(none)"


def reward_by_version(s: Section) -> Figure | None:
    recs = s.records()
    if not recs:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = [_label(r["resources_id"]) for r in recs]
    ax.plot(xs, [r["mean"] for r in recs], marker="o", label="mean")
    ax.fill_between(xs, [r["min"] for r in recs], [r["max"] for r in recs], alpha=0.15, label="min–max")
    for x, r in zip(xs, recs):
        ax.annotate(f"n={r['rewards']}", (x, r["mean"]), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=8)
    ax.set(title=s.title, xlabel="resources version", ylabel="reward")
    if len(xs) > 6:  # long version names side by side overlap
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    _legend_outside(ax)
    return fig


def reward_by_version_mode(s: Section) -> Figure | None:
    """One line per mode (train, val) over the policy versions."""
    recs = s.records()
    if not recs:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    order = list(dict.fromkeys(_label(r["resources_id"]) for r in recs))  # rows come in version order
    for mode in sorted({str(r["mode"]) for r in recs}):
        mine = {_label(r["resources_id"]): r["mean"] for r in recs if r["mode"] == mode}
        xs = [i for i, x in enumerate(order) if x in mine]  # positions: modes share one version axis
        ax.plot(xs, [mine[order[i]] for i in xs], marker="o",
                label={"val": "validation", "train": "training"}.get(mode, mode))
    ax.set_xticks(range(len(order)), order)
    ax.set(title=s.title, xlabel="resources version", ylabel="mean reward")
    if len(order) > 6:
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    _legend_outside(ax)
    return fig


def reward_over_time(s: Section) -> Figure | None:
    series: dict[str, list[tuple[dt.datetime, float]]] = defaultdict(list)
    for r in s.records():
        series[r["resources_id"]].append((_t(r["bucket"]), r["mean"]))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(10, 4))
    start = min(p[0] for pts in series.values() for p in pts)
    end = max(p[0] for pts in series.values() for p in pts)
    xlabel = ""
    for rid in sorted(series, key=resources_order):
        pts = series[rid]
        xs, xlabel = _elapsed([p[0] for p in pts], start, end)
        ax.plot(xs, [p[1] for p in pts], marker=".", label=_label(rid))
    ax.set(title=s.title, xlabel=xlabel, ylabel="mean reward")
    ax.set_xlim(left=0)  # elapsed time starts at 0 (one bucket alone would centre on it)
    _legend_outside(ax, ncol=1 if len(series) <= 16 else 2, title="resources")
    return fig


def latency(s: Section, top: int = 15) -> Figure | None:
    recs = s.records()[:top]
    if not recs:
        return None
    recs = recs[::-1]  # the slowest-ranked first, at the top
    labels = [f"{r['span']} · {r['model']}" if r["model"] else r["span"] for r in recs]
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(recs) + 1.5))
    ys = list(range(len(recs)))
    # Log scale: latencies span orders of magnitude, and one slow span name must not flatten the rest.
    floor = 1e-3  # ms; a zero duration still has a place on the log axis
    p50 = [max(float(r["p50_ms"]), floor) for r in recs]
    p95 = [max(float(r["p95_ms"]), floor) for r in recs]
    ax.hlines(ys, p50, p95, color="#999", linewidth=2, zorder=1)
    ax.scatter(p50, ys, marker="o", label="p50", zorder=2)
    ax.scatter(p95, ys, marker="D", label="p95", zorder=2)
    ax.set_xscale("log")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.set(title=s.title, xlabel="latency (ms, log scale)")
    _legend_outside(ax)
    return fig


def tokens_over_time(s: Section) -> Figure | None:
    recs = s.records()
    if not recs:
        return None
    fig, ax = plt.subplots(figsize=(10, 4))
    times = [_t(r["bucket"]) for r in recs]
    xs, xlabel = _elapsed(times, min(times))
    ax.stackplot(xs, [r["input_tokens"] for r in recs], [r["output_tokens"] for r in recs],
                 labels=["input", "output"], alpha=0.8)
    if len(xs) == 1:  # one bucket: a stack plot has no width, so show the point
        ax.bar(xs, [recs[0]["input_tokens"] + recs[0]["output_tokens"]], width=0.5, alpha=0.0)
    ax.set(title=s.title, xlabel=xlabel, ylabel="tokens per bucket")
    ax.set_xlim(left=0)
    _legend_outside(ax)
    return fig


def outcomes_over_time(s: Section) -> Figure | None:
    by_bucket: dict[str, dict[str, int]] = defaultdict(dict)
    for r in s.records():
        by_bucket[r["bucket"]][r["outcome"]] = r["attempts"]
    if not by_bucket:
        return None
    buckets = sorted(by_bucket)
    fig, ax = plt.subplots(figsize=(10, 4))
    xs, xlabel = _elapsed([_t(b) for b in buckets], _t(buckets[0]))
    width = 0.8 * float(np.min(np.diff(xs))) if len(xs) > 1 else 0.8
    bottom = [0] * len(buckets)
    for outcome in ("succeeded", "failed", "timeout", "unresponsive"):
        ys = [by_bucket[b].get(outcome, 0) for b in buckets]
        if any(ys):
            ax.bar(xs, ys, bottom=bottom, width=width, label=outcome)
            bottom = [a + b for a, b in zip(bottom, ys)]
    ax.set(title=s.title, xlabel=xlabel, ylabel="attempts ended")
    ax.set_xlim(left=0)
    _legend_outside(ax, title="outcome")
    return fig


PLOTS = {"reward_by_version": reward_by_version, "reward_by_version_mode": reward_by_version_mode,
         "reward_over_time": reward_over_time, "latency": latency,
         "tokens_over_time": tokens_over_time, "outcomes_over_time": outcomes_over_time}


def write(report: Report, out_dir: Path) -> list[Path]:
    """One PNG per plot that has data, plus ``report.html`` (every table, the PNGs inlined); returns the files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    images: dict[str, Path] = {}
    for name, make in PLOTS.items():
        section = report.sections.get(name)
        fig = make(section) if section is not None else None
        if fig is None:
            continue
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        images[name] = path
        written.append(path)
    page = out_dir / "report.html"
    page.write_text(_html(report, images))
    written.append(page)
    return written


def _html(report: Report, images: dict[str, Path]) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>litstream report</title><style>",
             ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
             "margin:.5em 0 2em}td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px}td.n{text-align:right}"
             "img{max-width:100%}.note{color:#666;font-size:13px}</style></head><body><h1>litstream report</h1>")]
    for name, s in report.sections.items():
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        if name in images:
            data = base64.b64encode(images[name].read_bytes()).decode()
            parts.append(f"<img alt='{html.escape(s.title)}' src='data:image/png;base64,{data}'>")
        parts.append(_table(s))
    parts.append("</body></html>")
    return "\n".join(parts)


def _table(s: Section) -> str:
    if not s.rows:
        return "<p class='note'>no data</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in s.columns)
    body = "".join("<tr>" + "".join(_td(v) for v in r) + "</tr>" for r in s.rows)
    note = f"<p class='note'>{html.escape(s.note)}</p>" if s.note else ""
    return f"<table><tr>{head}</tr>{body}</table>{note}"


def _td(value: Any) -> str:
    cls = " class='n'" if isinstance(value, (int, float)) else ""
    return f"<td{cls}>{html.escape(cell(value))}</td>"
