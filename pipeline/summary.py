"""A run's summary: the figures a run gathers, and the lines a person reads.

The lines say what the user asked about (how many units, how long, where the
results are) and where the time went (cluster start, input loading, the work,
the writing) with what bound the run; the planner's internals (probes, tasks,
units per task) are for ``-v``.
"""

from __future__ import annotations

import collections
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .costs.bounds import PHASES, TaskTime, cpu_bound, phase_bound, task_bound
from .figures import count, figure, rate, seconds, size, usd
from .storage import is_remote
from .workload import unit_label

__all__ = [
    "PHASES",
    "STARTUP_PARTS",
    "RunSummary",
    "TaskTime",
    "cost_line",
    "runs_per_day",
    "summary_lines",
    "task_bound",
    "usd",
]

#: Seconds in a day: runs back to back at a run's pace.
DAY_SECONDS = 86_400.0


def runs_per_day(wall_seconds: float) -> float | None:
    """Runs back to back in a day at this wall time (None when there is none)."""
    return DAY_SECONDS / wall_seconds if wall_seconds > 0 else None


@dataclass
class RunSummary:
    job_id: str
    workload: str
    output: str | None
    units: int
    tasks: int
    units_per_task: int
    tasks_skipped: int
    unit_name: str = "unit"
    #: What the summary calls the tasks' compute phase (the workload's ``work_name``).
    work_name: str = "work"
    #: The first tasks, run to measure the rate that sized the others.
    probe_tasks: int = 0
    #: Units in the tasks this run ran, and in the tasks it found complete.
    units_run: int = 0
    units_skipped: int = 0
    #: Failed units of the job as it stands: those of tasks that failed in this run
    #: (a rerun retries them) and those recorded as data (a chunk whose fit failed;
    #: a rerun gives the same answer, so it does not refit them).
    units_failed: int = 0
    units_retryable: int = 0
    #: Whether the units recorded as failed are called again by a rerun.
    reruns_failed_units: bool = False
    #: Of the units this run ran, those that failed (either way).
    units_failed_in_run: int = 0
    #: Of the units this run ran, those that succeeded in a task that failed (beside a
    #: unit of ``TaskOutput.failures``): not stored, they run again with their task.
    units_not_kept: int = 0
    failures: list[dict] = field(default_factory=list)
    wall_seconds: float = 0.0
    #: The whole command's wall time for this job, as a user running a batch of such
    #: commands sees it: the job's run from planning to finalize (probes included)
    #: and, for a batch's first job, its start-up (the interpreter's start, building
    #: the jobs and their default inputs, checking the inputs, starting the cluster),
    #: for its last the cluster's stop. Runs per day divide a day by it.
    command_seconds: float = 0.0
    #: Seconds the driver waited for the cluster, after validating the inputs.
    cluster_seconds: float = 0.0
    #: The batch's start-up (its first job's summary): seconds of the interpreter's
    #: start and imports, building the jobs, checking the inputs, starting the cluster
    #: (meanwhile) and its workers' imports, waiting for it (:data:`STARTUP_PARTS`).
    startup: dict[str, float] = field(default_factory=dict)
    units_per_second: float = 0.0
    bytes_written: int = 0
    busy_seconds: float = 0.0
    #: CPU seconds the worker processes used during this run's tasks.
    cpu_seconds: float = 0.0
    #: Seconds the tasks were runnable but waiting for a core (None: not measured).
    runq_seconds: float | None = None
    #: Whether the run was on a remote cluster (--scheduler), whose workers --workers
    #: does not start.
    remote: bool = False
    #: Worker-seconds by :data:`PHASES`, summed over this run's tasks.
    phases: dict[str, float] = field(default_factory=dict)
    workers: int = 0
    parallel_efficiency: float | None = None
    complete: bool = False
    #: Input bytes the tasks read, and that over the bytes their units hold (1.0: a
    #: task reads nothing its units do not need); None for workloads that do not say.
    bytes_read: int = 0
    bytes_read_ratio: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    #: What the run cost (see pipeline/costs/run_cost.py): the worker-seconds it is charged for
    #: (busy ones on the embedded cluster, workers x wall time on a remote one), their
    #: price and its source, and runs per day at this run's pace.
    worker_seconds: float = 0.0
    cost_usd: float | None = None
    usd_per_worker_hour: float | None = None
    price_source: str | None = None
    runs_per_day: float | None = None
    #: The plan as run: probe sizes, units per task, the measured cost model.
    plan: dict[str, Any] = field(default_factory=dict)
    #: One entry per task this run ran: index, worker, start (s since the run's
    #: start), seconds, units, failed units; for the report page.
    task_timings: list[dict] = field(default_factory=list)
    #: Of ``wall_seconds``, the job's finalization (its manifest consolidated).
    finalize_seconds: float = 0.0
    #: Seconds the cluster took to stop after the batch's last job (its summary is
    #: told after that, with them in ``command_seconds``).
    shutdown_seconds: float = 0.0
    #: Whether this run found every task done and only finalized the job (no cluster).
    finalized_now: bool = False
    #: The report page (HTML) written for this run (``--report``), else None.
    report: str | None = None

    def __str__(self) -> str:
        """The lines ``pipeline run`` prints at the job's end."""
        return self.text()

    def text(self, verbose: bool = False) -> str:
        """The summary's lines (``verbose``: with ``-v``'s), as ``pipeline run`` prints them."""
        return "\n".join(line for line, _ in summary_lines(self, verbose))

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        """IPython and Jupyter show the summary's lines, not the dataclass's fields."""
        printer.text(self.text())

    def count_command(self, seconds: float) -> None:
        """Take ``seconds`` as the whole command's wall time (:attr:`command_seconds`),
        and runs per day at its pace once the run's cost is counted."""
        self.command_seconds = seconds
        if self.runs_per_day is not None:
            self.runs_per_day = runs_per_day(seconds)

    def add_startup(self, startup: dict[str, float]) -> None:
        """The batch's start-up (its first job's): said in the time line, and part of
        the whole command's wall time."""
        self.startup = startup
        self.cluster_seconds = startup.get("waited for the cluster", 0.0)
        before = sum(startup.get(k, 0.0) for k in STARTUP_PARTS)
        self.count_command(self.command_seconds + before)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def task_time(self) -> TaskTime:
        s3 = is_remote(self.output or "")
        return TaskTime(
            self.busy_seconds,
            self.phases,
            self.cpu_seconds,
            self.bytes_written,
            s3,
            self.runq_seconds,
        )

    @property
    def units_ok(self) -> int:
        """Units this run completed and stored."""
        return self.units_run - self.units_failed_in_run - self.units_not_kept


#: The parts of a batch's start-up, in order, that its command's wall time adds up:
#: the interpreter's start and imports (``pipeline run``), building the jobs (the
#: default inputs a workload writes), checking the inputs while the cluster starts,
#: and what was left of the cluster's start after that.
STARTUP_PARTS = ("python start", "job set-up", "inputs checked", "waited for the cluster")


def summary_lines(s: RunSummary, verbose: bool = False) -> list[tuple[str, bool]]:
    """(line, to_stderr) pairs for the end of a job."""
    unit = s.unit_name
    out: list[tuple[str, bool]] = []
    if not s.units_run and s.complete:
        recorded = s.units_failed - s.units_retryable
        failed = f" ({recorded:,} failed, recorded in the results)" if recorded else ""
        left = "nothing left to run (--overwrite starts over)"
        if s.finalized_now:  # (a run stopped between its last task and this)
            left = (f"its tasks were all done and this run finalized it in "
                    f"{seconds(s.finalize_seconds)}, with no cluster")  # fmt: skip
        out.append((
            f"{s.workload} job {s.job_id!r} is complete: {s.units:,} {unit}s{failed}; {left}",
            False,
        ))  # fmt: skip
    else:
        skipped = f"; {s.units_skipped:,} were already complete" if s.units_skipped else ""
        out.append((
            f"{s.workload} job {s.job_id!r}: {s.units_ok:,} of {s.units_run:,} {unit}s "
            f"in {s.wall_seconds:.2f} s = {rate(s.units_per_second)}/s on {s.workers} workers"
            + skipped,
            False,
        ))  # fmt: skip
        out.append(("  time: " + time_split(s), False))
        bound = bottleneck(s)
        if bound:
            out.append(("  " + bound, False))
    if verbose:
        up_to = "" if s.tasks * s.units_per_task == s.units else "up to "
        tasks = f"{s.tasks} tasks of {up_to}{s.units_per_task:,} {unit}s"
        if s.probe_tasks:
            sized = s.tasks - s.probe_tasks
            then = f", then {sized} of {s.units_per_task:,} {unit}s" if sized else ""
            tasks = f"{s.tasks} tasks ({s.probe_tasks} sizing probes{then})"
        out.append((f"  plan: {tasks}; {s.tasks_skipped} skipped as complete", False))
    if s.cost_usd is not None and s.units_run:
        out.append(("  " + cost_line(s), False))
    if s.output:
        out.append((f"  results: {s.output}", False))
    if s.report:
        out.append((f"  report: {s.report}", False))
    for key, value in s.details.items():
        out.append((f"  {key}: {value}", False))
    if s.units_failed:
        out.extend((line, True) for line in failure_lines(s))
    return out


def time_split(s: RunSummary) -> str:
    """The command's wall time in all and by part, in order (parts under 50 ms left
    out); the run's by phase, the workers' seconds per phase over their number."""
    parts = []
    for name in STARTUP_PARTS[:2]:
        if s.startup.get(name, 0.0) >= 0.05:
            parts.append(f"{name} {seconds(s.startup[name])}")
    checked = s.startup.get("inputs checked", 0.0)
    if "cluster start" in s.startup:  # (the cluster started while the inputs were checked)
        start = checked + s.startup["waited for the cluster"]
        set_up = s.startup.get("cluster set-up", 0.0)  # (the jobs' code shipped, say)
        of_it = f", {seconds(set_up)} of it the jobs' set-up" if set_up >= 0.05 else ""
        parts.append(
            f"start-up {seconds(start)} (inputs checked {seconds(checked)} "
            f"while the cluster started in {seconds(s.startup['cluster start'])}{of_it})"
        )
    else:
        if checked >= 0.05:
            parts.append(f"inputs checked {seconds(checked)}")
        if s.cluster_seconds:
            parts.append(f"cluster start {seconds(s.cluster_seconds)}")
    w = max(1, s.workers)
    names = {"inputs": "input loading", "compute": s.work_name, "writing": "writing"}
    inner = [f"{names[p]} {seconds(s.phases[p] / w)}" for p in PHASES if s.phases.get(p)]
    per_worker = f" ({', '.join(inner)} per worker)" if inner else ""
    parts.append(f"run {seconds(s.wall_seconds - s.finalize_seconds)}{per_worker}")
    if s.finalize_seconds >= 0.05:
        parts.append(f"finalizing {seconds(s.finalize_seconds)}")
    if s.shutdown_seconds >= 0.05:
        parts.append(f"cluster stop {seconds(s.shutdown_seconds)}")
    whole = s.command_seconds
    in_all = f"{seconds(whole)} in all: " if whole > s.wall_seconds else ""
    return in_all + ", ".join(parts)


def cost_line(s: RunSummary) -> str:
    per_day = f"; {s.runs_per_day:,.0f} runs/day at this pace" if s.runs_per_day else ""
    return (
        f"cost: {usd(s.cost_usd or 0.0)} for {figure(s.worker_seconds)} worker-seconds at "
        f"{usd(s.usd_per_worker_hour or 0.0)}/worker-hour ({s.price_source}){per_day}"
    )


def bottleneck(s: RunSummary) -> str | None:
    """What bound the run, in a sentence, from where the workers' time went."""
    if not s.units_run or not s.wall_seconds:
        return None
    w = max(1, s.workers)
    t = s.task_time()
    inputs, compute = t.phases.get("inputs", 0.0), t.phases.get("compute", 0.0)
    unit = s.unit_name
    bound = phase_bound(t, s.wall_seconds * w)
    if bound in ("S3-bound", "disk-bound"):
        built = f"; {unit}s were built at {s.units_run / (compute / w):,.0f}/s" if compute else ""
        return (
            f"{bound}: wrote {size(s.bytes_written)} at "
            f"{size(s.bytes_written / s.wall_seconds)}/s{built}"
        )
    if bound == "input-bound":
        return f"input-bound: loading inputs took {seconds(inputs / w)} of each worker's time"
    eff = s.parallel_efficiency or 0.0
    longest = max(s.task_timings, key=lambda r: r["seconds"], default=None)
    if eff < 0.75 and longest and longest["seconds"] >= 0.6 * s.wall_seconds and w > 1:
        # One long task (a slow unit, or few tasks): the other workers ran out of work
        return (
            f"straggler-bound: task {longest['index']} ({count(longest['units'], unit)}) ran "
            f"{seconds(longest['seconds'])} of the "
            f"run's {seconds(s.wall_seconds)} while the other workers had no work left; "
            "smaller tasks (--units-per-task) spread it, unless one unit is that long"
        )
    if eff < 0.5:
        return (
            f"overhead-bound: the workers were busy {eff:.0%} of the run (start-up, "
            "scheduling, or too little work for the workers)"
        )
    busy = t.seconds
    on_cpu, queued = t.cpu / busy if busy else 0.0, (t.runq or 0.0) / busy if busy else 0.0
    bound = cpu_bound(t)
    if bound == "CPU-contended":
        return (
            f"CPU-contended: {w} workers busy {eff:.0%} of the run, on the CPU {on_cpu:.0%} "
            f"of that time and waiting for a core {queued:.0%} (the machine's cores were "
            "busy with other work: other processes, or more workers than cores); more "
            "workers would only wait longer"
        )
    if bound == "wait-bound":
        more = (
            "more worker processes (dask worker --nworkers, even beyond the cores)"
            if s.remote
            else "more workers (--workers, even beyond the cores)"
        )
        if t.runq is None:  # not measured: a core held by other work looks the same
            why = (
                "network, disk, processes they started, whose CPU is not counted, or cores "
                "busy with other work"
            )
            more = "unless other work held the cores, " + more
        else:
            why = "network, disk, or processes they started, whose CPU is not counted"
        return (
            f"wait-bound: {w} workers busy {eff:.0%} of the run, on the CPU {on_cpu:.0%} of "
            f"that time (the tasks waited: sleep, {why}); {more} would overlap more waits"
        )
    if queued >= 0.2:
        return (
            f"CPU-bound: {w} workers busy {eff:.0%} of the run, waiting for a core "
            f"{queued:.0%} of that time (other processes, or more workers than cores)"
        )
    return f"CPU-bound: {w} workers busy {eff:.0%} of the run"


def failure_lines(s: RunSummary) -> list[str]:
    by_type = collections.Counter(f["error_type"] for f in s.failures)
    kinds = ", ".join(f"{n} {t}" for t, n in by_type.most_common())
    recorded = s.units_failed - s.units_retryable
    if "WorkloadError" in by_type:
        # (a plug-in's mistake: running it again fails the same way)
        advice = "the workload did not keep the workload contract, as said below; a rerun fails "
        advice += "the same way until it is mended"
    elif s.units_retryable:
        advice = "run the same command again to retry the " + (
            f"{s.units_retryable} that failed in their task" if recorded else "failed ones"
        )
    else:
        advice = "they are recorded in the results and a rerun would give the same answer"
    lines = [f"  FAILED: {count(s.units_failed, s.unit_name)} ({kinds}); {advice}"]
    for f in s.failures[:5]:
        which = unit_label(f["unit"], f.get("key", ""))
        lines.append(f"    {s.unit_name} {which}: {f['error_type']}: {f['message']}")
    if len(s.failures) > 5:
        lines.append(f"    ... and {len(s.failures) - 5} more")
    if s.units_not_kept:
        # A task with a failed unit writes no entry: its other units are not stored
        lines.append(
            f"  not kept: {count(s.units_not_kept, s.unit_name)} that succeeded in the tasks "
            "of failed ones, which run again whole"
        )
    return lines
