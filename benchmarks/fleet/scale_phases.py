"""The phases of a scale-sim run, from the driver's report and the job's recorded plan:
when the first task started, the probes ended, the other tasks ran, and what came
after the last task (the manifest's consolidation)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

__all__ = ["describe_phases", "run_phases", "tasks_run"]


def run_phases(report: Path, output: Path) -> dict:
    """Where the run's time went, from the driver's JSON report: when the probes ended
    (the last probe task's end), the tasks' seconds against the workers' time."""
    found = sorted(report.glob("*.json"))
    records = list(output.glob("*/job.json"))
    if not found or not records:
        return {}
    summary = json.loads(found[0].read_text())
    timings = summary.get("task_timings") or []
    head = len(json.loads(records[0].read_text()).get("head") or [])
    probes = [t for t in timings if t["index"] < head]
    rest = [t for t in timings if t["index"] >= head]
    out = {}
    if probes:
        out["probes_end_seconds"] = round(max(t["start"] + t["seconds"] for t in probes), 2)
    if rest:
        out["rest_start_seconds"] = round(min(t["start"] for t in rest), 2)
        out["rest_end_seconds"] = round(max(t["start"] + t["seconds"] for t in rest), 2)
        out["rest_task_seconds_median"] = sorted(t["seconds"] for t in rest)[len(rest) // 2]
    out["task_seconds_total"] = round(sum(t["seconds"] for t in timings), 1)
    # The scheduler's CPU per task as the planner measured it while the probes ran.
    model = json.loads(records[0].read_text()).get("cost_model") or {}
    if "overhead" in model:
        out["probes_scheduler_cpu_per_task"] = model["overhead"]
    if timings:
        out["first_task_start_seconds"] = round(min(t["start"] for t in timings), 2)
    # A worker's idle time between one of its tasks and the next (the task's report,
    # the next one's hand-over): the rest's median, per task.
    by_worker: dict[str, list] = {}
    for t in rest:
        by_worker.setdefault(t.get("address") or t["worker"], []).append(t)
    gaps = []
    for tasks in by_worker.values():
        tasks.sort(key=lambda t: t["start"])
        gaps += [b["start"] - a["start"] - a["seconds"] for a, b in itertools.pairwise(tasks)]
    if gaps:
        out["rest_gap_seconds_median"] = round(sorted(gaps)[len(gaps) // 2], 3)
    return out


def describe_phases(figures: dict) -> str:
    """One line: when the run's phases began and ended (seconds from the run's start)
    and its efficiency."""
    f = figures.get
    parts = [
        f"first task {f('first_task_start_seconds', '-')} s",
        f"probes end {f('probes_end_seconds', '-')} s",
        f"rest {f('rest_start_seconds', '-')}-{f('rest_end_seconds', '-')} s",
        f"finalization {f('finalization_seconds', '-')} s",
        f"run {f('run_seconds', '-')} s (ideal {f('ideal_seconds', '-')} s)",
        f"efficiency {f('efficiency', '-')}",
    ]
    if "probes_scheduler_cpu_per_task" in figures:
        parts.append(f"scheduler {figures['probes_scheduler_cpu_per_task'] * 1e3:.3g} ms a task")
    return "phases: " + ", ".join(parts)


def tasks_run(output: Path) -> int:
    """The job's tasks, from its recorded plan (probes and the rest)."""
    records = list(output.glob("*/job.json"))
    if not records:
        return 0
    plan = json.loads(records[0].read_text())
    return len(plan.get("head") or []) + len(plan.get("stops") or [])
