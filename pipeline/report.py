"""The run report a person reads: one self-contained HTML page per job.

The page holds the summary and the cost, throughput over time, a histogram of
task durations, each worker's busy timeline, the failures and the plan. The
plots are drawn with matplotlib and embedded as base64 PNG, so the page needs no
other file and no network (it is meant to be mailed or archived with a run).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterable
from pathlib import Path

from .summary import RunSummary, cost_line, summary_lines
from .workload import unit_label

__all__ = ["task_timings", "write_report_page"]

_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1100px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.5em; }
pre { background: #f4f4f4; padding: 0.8em; white-space: pre-wrap; }
table { border-collapse: collapse; } td, th { border: 1px solid #bbb; padding: 0.2em 0.6em; }
th { background: #eee; text-align: left; } img { max-width: 100%; }
"""


def task_timings(receipts: Iterable, t_epoch: float) -> list[dict]:
    """Each task's index, worker process, Dask worker (its address), start (s after
    ``t_epoch``), seconds and units."""
    rows = []
    for r in sorted(receipts, key=lambda r: r.index):
        if not r.started:  # a task the cluster lost: never heard from
            continue
        rows.append({
            "index": r.index,
            "worker": f"{r.worker}:{r.pid}",
            "address": r.worker_address,
            "start": round(r.started - t_epoch, 4),
            "seconds": round(r.seconds, 4),
            "units": r.units,
            # failures as data (a map unit that raised, a chunk that did not fit) too
            "failed": len(r.failures) + len(r.recorded or ()),
        })  # fmt: skip
    return rows


def write_report_page(summary: RunSummary, path: str | Path) -> Path:
    """Write the job's page to ``path``; return it."""
    s = summary
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(s.workload)} job {_e(s.job_id)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{_e(s.workload)} job {_e(s.job_id)}</h1>",
        "<h2>Summary</h2>",
        "<pre>" + _e("\n".join(line for line, _ in summary_lines(s, verbose=True))) + "</pre>",
        "<h2>Cost</h2>",
        _cost_html(s),
    ]
    timings = s.task_timings
    if timings:
        parts += [
            "<h2>Throughput over time</h2>",
            _img(_throughput_plot(s), "throughput over time"),
            "<h2>Task durations</h2>",
            _img(_duration_plot(s), "histogram of task durations"),
            "<h2>Workers' busy timeline</h2>",
            _img(_timeline_plot(s), "each worker's busy timeline"),
        ]
    else:
        parts.append("<p>This run ran no task (the job was complete already).</p>")
    parts += ["<h2>Failures</h2>", _failures_html(s), "<h2>Plan</h2>", _plan_html(s)]
    parts.append("</body></html>")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts), encoding="utf-8")
    return out


def _e(text) -> str:
    return html.escape(str(text))


def _cost_html(s: RunSummary) -> str:
    if s.cost_usd is None or not s.units_run:
        return "<p>No cost: this run ran no task.</p>"
    return f"<p>{_e(cost_line(s))}</p>"


def _failures_html(s: RunSummary) -> str:
    if not s.failures:
        return "<p>None.</p>"
    rows = [f"<tr><th>{_e(s.unit_name)}</th><th>error</th><th>message</th></tr>"]
    for f in s.failures[:1000]:
        rows.append(
            f"<tr><td>{_e(unit_label(f['unit'], f.get('key', '')))}</td>"
            f"<td>{_e(f['error_type'])}</td>"
            f"<td>{_e(f['message'])}</td></tr>"
        )
    more = f"<p>... and {len(s.failures) - 1000:,} more.</p>" if len(s.failures) > 1000 else ""
    return "<table>" + "".join(rows) + "</table>" + more


def _plan_html(s: RunSummary) -> str:
    probes = s.plan.get("probe_sizes") or []
    model = s.plan.get("cost_model")
    rows = [
        ("tasks", f"{s.tasks:,} ({s.tasks_skipped:,} skipped as complete)"),
        (f"{s.unit_name}s per task (typical)", f"{s.units_per_task:,}"),
        ("probe tasks", f"{len(probes)}: sizes {', '.join(map(str, probes)) or 'none'}"),
    ]
    if model:
        rows.append(("cost model (s per task)", ", ".join(f"{k} {v:g}" for k, v in model.items())))
    rows.append(("workers", str(s.workers)))
    return (
        "<table>"
        + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
        + ("</table>")
    )


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _figure(height: float = 3.2):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(9, height), dpi=100, layout="constrained")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _throughput_plot(s: RunSummary) -> bytes:
    """Units per second over the run: each task's units spread evenly over its run time
    (task ends alone would be spikes, one per task), summed over the workers."""
    import numpy as np

    t = s.task_timings
    starts = np.array([x["start"] for x in t])
    ends = starts + np.array([max(x["seconds"], 1e-6) for x in t])
    rates = np.array([(x["units"] - x["failed"]) for x in t], dtype=float) / (ends - starts)
    span = max(float(ends.max()), 1e-3)
    grid = np.linspace(0.0, span, 400)
    active = (starts[None, :] <= grid[:, None]) & (grid[:, None] < ends[None, :])
    rate = (active * rates[None, :]).sum(axis=1)
    fig = _figure()
    ax = fig.subplots()
    ax.plot(grid, rate, color="tab:blue")
    ax.fill_between(grid, rate, alpha=0.3, color="tab:blue")
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel(f"{s.unit_name}s / s")
    ax.set_xlim(0, span)
    ax.set_ylim(bottom=0)
    return _png(fig)


def _duration_plot(s: RunSummary) -> bytes:
    seconds = [t["seconds"] for t in s.task_timings]
    probes = len(s.plan.get("probe_sizes") or [])
    fig = _figure()
    ax = fig.subplots()
    probe_s = [t["seconds"] for t in s.task_timings if t["index"] < probes]
    rest = [t["seconds"] for t in s.task_timings if t["index"] >= probes]
    bins = max(5, min(50, len(seconds)))
    if probe_s:
        ax.hist([rest, probe_s], bins=bins, stacked=True, label=["tasks", "probe tasks"],
                color=["tab:blue", "tab:orange"])  # fmt: skip
    else:
        ax.hist(rest, bins=bins, label="tasks", color="tab:blue")
    ax.set_xlabel("task duration (s)")
    ax.set_ylabel("tasks")
    ax.legend()
    return _png(fig)


def _timeline_plot(s: RunSummary) -> bytes:
    workers = sorted({t["worker"] for t in s.task_timings})
    fig = _figure(max(2.0, 0.35 * len(workers) + 1.2))
    ax = fig.subplots()
    for row, worker in enumerate(workers):
        spans = [(t["start"], t["seconds"]) for t in s.task_timings if t["worker"] == worker]
        failed = [t["failed"] > 0 for t in s.task_timings if t["worker"] == worker]
        colors = ["tab:red" if f else "tab:green" for f in failed]
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colors, edgecolor="white", lw=0.3)
    ax.set_yticks(range(len(workers)), labels=workers)
    ax.set_xlabel("seconds since the run started (red: a task with failed units)")
    ax.set_xlim(left=0)
    return _png(fig)
