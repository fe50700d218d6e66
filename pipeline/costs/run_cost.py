"""What a run cost, and what a job will cost on a fleet: wall time, dollars, runs per day,
and the limit that binds.

A run is charged for worker-seconds. On the embedded cluster that is the
seconds the workers were busy with tasks, priced as the same work on the
configured instance type (what the run would cost there); on a remote cluster
it is every worker for the whole run (idle workers are paid for too).

A projection (``pipeline estimate``) takes the cost model the probe tasks
measured (:mod:`pipeline.planning.sizing`: fixed + per-unit seconds per task), cuts the
whole job into tasks for the fleet's workers as the planner would, and takes
the largest of four floors on the wall time:

- the tasks: the probing phase (as long as it lasted here), then the other tasks
  handed out to the fleet's workers (:func:`pipeline.planning.sizing.makespan`), named by
  what bound the tasks that make most of it (the probes, or the full-size tasks the
  estimate ran after them) as a run's summary would name it
  (:func:`pipeline.summary.task_bound`: CPU, contended CPU, writing, loading
  inputs, waits);
- network: the bytes the units read and write through each instance's NIC;
- S3: the objects written, at :data:`S3_PUTS_PER_SECOND` per prefix (a job
  writes under one prefix; one that writes no output has no such floor);
- the scheduler: its seconds per task, one task after another: on this cluster
  what the probes measured (the scheduler's CPU while they ran), on a fleet
  :data:`SCHEDULER_SECONDS_PER_TASK` (its scheduler has an instance of its own).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..planning.plan import Plan, requested_units_per_task
from ..planning.probe_sizes import is_small_job
from ..planning.sizing import SCHEDULER_SECONDS_PER_TASK, CostModel, UnitLayout, cut_tasks, makespan
from ..summary import (
    DAY_SECONDS,
    RunSummary,
    TaskTime,
    count,
    runs_per_day,
    seconds,
    task_bound,
    usd,
)
from .prices import (
    DEFAULT_SCHEDULER_INSTANCE,
    Instance,
    PriceTable,
    WorkerPrice,
)

__all__ = [
    "Fleet",
    "JobSample",
    "DAY_SECONDS",
    "Projection",
    "add_run_cost",
    "parse_fleet",
    "project",
    "runs_per_day",
]

#: S3 accepts about this many PUT requests a second per prefix (AWS's figure).
S3_PUTS_PER_SECOND = 3_500.0
#: The most workers one scheduler handled in the reference deployment.
SCHEDULER_WORKER_WALL = 480


def add_run_cost(summary: RunSummary, price: WorkerPrice, *, remote: bool) -> None:
    """Fill ``summary``'s worker-seconds, cost and runs per day (see the module's docstring)."""
    if remote:
        summary.worker_seconds = summary.workers * summary.wall_seconds
    else:
        summary.worker_seconds = summary.busy_seconds
    summary.usd_per_worker_hour = price.usd_per_hour
    summary.price_source = price.source
    summary.cost_usd = summary.worker_seconds / 3600 * price.usd_per_hour
    # The whole command's pace (start-up, planning, the run, finalize), where known
    summary.runs_per_day = runs_per_day(summary.command_seconds or summary.wall_seconds)


@dataclass(frozen=True)
class Fleet:
    """``count`` instances of one type, one worker per vCPU, with the Terraform
    module's scheduler instance and load balancer (``scheduler`` None: a fleet
    described only by its workers, as the embedded cluster)."""

    instance: Instance | None
    count: int
    workers: int
    usd_per_hour: float
    label: str
    #: Whether the job's output goes to S3 (the module's fleet writes to its bucket).
    s3: bool = True


def parse_fleet(text: str, table: PriceTable) -> Fleet:
    """``TYPE:COUNT`` (``c5.24xlarge:5``), priced with the module's scheduler and NLB."""
    name, _, count_text = text.partition(":")
    try:
        count = int(count_text) if count_text else 1
    except ValueError:
        count = 0
    if not name or count < 1:
        raise ConfigError(
            f"--fleet {text!r}: expected INSTANCE_TYPE:COUNT, e.g. c5.24xlarge:5 (a count of 1 "
            "or more)"
        )
    inst = table.instance(name, setting="--fleet")
    scheduler = table.instance(
        DEFAULT_SCHEDULER_INSTANCE, setting="scheduler instance (the Terraform module's)"
    )
    nlb = table.load_balancer_per_hour
    per_hour = count * inst.usd_per_hour + scheduler.usd_per_hour + (nlb or 0.0)
    label = (
        f"{count} x {inst.name} ({count * inst.vcpus:,} workers) + {scheduler.name} scheduler "
        + ("+ NLB" if nlb is not None else "(no NLB price in the price file)")
        + f" at ${per_hour:,.2f}/h"
    )
    return Fleet(inst, count, count * inst.vcpus, per_hour, label)


@dataclass(frozen=True)
class JobSample:
    """What the probe tasks measured of a job, per unit besides the cost model: the
    units they ran and their wall time on ``workers`` workers (a run's probing phase,
    cold start included)."""

    model: CostModel
    units: int
    seconds: float
    bytes_written_per_unit: float = 0.0
    bytes_read_per_unit: float = 0.0
    objects_per_unit: float = 0.0
    workers: int = 1
    #: Whether a run of the job probes (False: a job too small to, or --units-per-task).
    probed: bool = True
    probe_tasks: int = 0
    #: Where the probes' time went (None: not measured): what bound them, cold start
    #: included (a cube job's first tasks load the frames).
    spent: TaskTime | None = None
    #: The same of the full-size tasks the estimate ran after the probes, on warm
    #: workers (None: none ran): what binds the rest of the job.
    steady: TaskTime | None = None
    #: Whether the job writes output (cubes with ``sink = "none"`` write nothing, not
    #: even a manifest entry per task).
    writes_output: bool = True


@dataclass
class Projection:
    fleet: Fleet
    wall_seconds: float
    cost_usd: float
    runs_per_day: float | None
    tasks: int
    binding: str
    #: The floor on the wall time each limit sets, in seconds (None: does not apply).
    limits: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: What bound the tasks (:func:`pipeline.summary.task_bound`), for the "tasks" limit.
    task_bound: str = "CPU-bound"
    #: Why, in a few words ("" for CPU-bound).
    task_bound_why: str = ""


#: The other limits' names (the tasks' are :data:`TASK_BOUND_NAMES`).
LIMIT_NAMES = {
    "network": "the network (each instance's NIC)",
    "s3": "S3 request rate (PUTs per prefix)",
    "scheduler": "the scheduler's task rate",
}

#: The tasks' limit by what bound them, as a run's summary names it.
TASK_BOUND_NAMES = {
    "CPU-bound": "CPU",
    "CPU-contended": "CPU, contended",
    "wait-bound": "the tasks' waits",
    "input-bound": "loading inputs",
    "S3-bound": "writing to S3",
    "disk-bound": "writing to disk",
}


def project(
    layout: UnitLayout,
    sample: JobSample,
    fleet: Fleet,
    task_seconds: float = 1.0,
    units_per_task: int | None = None,
) -> Projection:
    """The whole job's wall time, cost and runs per day on ``fleet``, and what binds.
    Tasks are cut as the planner would for the fleet's workers, or of ``units_per_task``
    (rounded up to whole groups, as a run does)."""
    n, w, model = layout.n, fleet.workers, sample.model
    if fleet.instance is not None:
        # The overhead the probes measured is this cluster's, whose scheduler may share
        # its cores with the workers (the embedded one); a fleet's has its own instance.
        model = dataclasses.replace(model, overhead=SCHEDULER_SECONDS_PER_TASK)
    # A run first probes: rounds of one task per worker, whose wall time does not
    # depend on the workers' count, so the probing phase lasts what it lasted here and
    # covers as many more units as the fleet has more workers. The rest is then cut
    # as the planner would for the fleet's workers.
    start, probing, probe_tasks = 0, 0.0, 0
    # Too small to probe on the fleet's workers: one round, unprobed, as the runner
    # does it (not this cluster's probing time, which can be most of such a job).
    small = not units_per_task and is_small_job(n, w)
    if sample.probed and not units_per_task and not small:
        start = min(n, round(sample.units * w / max(1, sample.workers)))
        probe_tasks = min(
            -(-start // layout.granularity), round(sample.probe_tasks * w / max(1, sample.workers))
        )
        probing = sample.seconds
    if units_per_task:
        # the runner's tasks: of whole groups (a cube job's shards), as load_plan cuts them
        size = requested_units_per_task(units_per_task, layout.granularity)
        stops = [t.stop for t in Plan(units_per_task=size, units=n).tasks]
    elif small:
        stops = cut_tasks(layout, 0, CostModel(0.0, 1.0), w, 1.0, rounds=1)
    else:
        stops = cut_tasks(layout, start, model, w, task_seconds)
    tasks = probe_tasks + len(stops)
    rest = makespan(layout, start, stops, model, w) if stops else 0.0
    limits: dict[str, float | None] = {"tasks": probing + rest, "network": None, "s3": None}
    moved = n * (sample.bytes_written_per_unit + sample.bytes_read_per_unit)
    if fleet.instance is not None and moved:
        per_instance = moved / fleet.count
        limits["network"] = per_instance * 8 / (fleet.instance.network_gbps * 1e9)
    if fleet.s3 and sample.writes_output:
        puts = n * sample.objects_per_unit + tasks + 1  # + a manifest entry per task, job.json
        limits["s3"] = puts / S3_PUTS_PER_SECOND
    limits["scheduler"] = tasks * model.overhead
    # Ties go to the narrower resource: the tasks' makespan has the scheduler's floor in it.
    order = [k for k in ("scheduler", "s3", "network", "tasks") if limits[k] is not None]
    binding = max(order, key=lambda k: limits[k])
    wall = float(limits[binding])
    # Named by the tasks that make most of the makespan: the probing phase, as it was
    # measured (a small job, or a large fleet), else the full-size tasks
    steady = sample.steady is not None and rest > probing
    measured = sample.steady if steady else sample.spent
    bound, why = _task_bound(measured, steady)
    notes = []
    if binding == "tasks" and bound == "wait-bound":
        notes.append(
            "the tasks waited (sleep, network, disk, or processes they started, whose CPU "
            "is not counted), so the workers' time binds, not their cores: more workers "
            "than cores would overlap the waits"
        )
    if binding == "tasks" and bound == "CPU-contended":
        notes.append(
            "the tasks were runnable but waiting for a core much of their time (this "
            "machine's cores were busy with other work): the per-unit seconds, and so these "
            "projections, are this loaded machine's; more workers would only wait longer"
        )
    if bound in ("S3-bound", "disk-bound") and fleet.s3 != measured.s3:  # (measured: not CPU)
        here, there = ("S3", "a disk") if measured.s3 else ("a disk", "S3")
        notes.append(
            f"the tasks' writes were timed to {here} (this estimate's output); this fleet "
            f"writes to {there}, at a rate of its own"
        )
    if w > SCHEDULER_WORKER_WALL:
        notes.append(
            f"{w:,} workers: the reference deployment found about {SCHEDULER_WORKER_WALL} the "
            "most one scheduler handled (timeouts beyond it)"
        )
    return Projection(
        fleet,
        wall,
        wall / 3600 * fleet.usd_per_hour,
        runs_per_day(wall),
        tasks,
        binding,
        limits,
        notes,
        bound,
        why,
    )


def _task_bound(spent: TaskTime | None, steady: bool) -> tuple[str, str]:
    """What bound the probes' tasks (or the full-size ones: ``steady``), and why in a
    few words."""
    if spent is None or not spent.seconds:
        return "CPU-bound", ""
    bound = task_bound(spent)
    share = {
        "S3-bound": ("writing was", spent.phases.get("writing", 0.0)),
        "disk-bound": ("writing was", spent.phases.get("writing", 0.0)),
        "input-bound": ("loading inputs was", spent.phases.get("inputs", 0.0)),
        "wait-bound": ("on the CPU", spent.cpu),
        "CPU-contended": ("waiting for a core", spent.runq or 0.0),
    }.get(bound)
    if share is None:
        return bound, ""
    which = "the full-size tasks'" if steady else "the probes' tasks'"
    return bound, f"{share[0]} {share[1] / spent.seconds:.0%} of {which} time"


def limit_name(p: Projection, key: str, full: bool = False) -> str:
    """Limit ``key`` of ``p`` as its lines say it; ``full``: as the line of the one that
    binds says it (with what bound the tasks and why)."""
    if key == "tasks":
        name = TASK_BOUND_NAMES[p.task_bound]
        return f"{name} ({p.task_bound}: {p.task_bound_why})" if full and p.task_bound_why else name
    return LIMIT_NAMES[key] if full else LIMIT_NAMES[key].split(" (")[0]


def _duration(value: float) -> str:
    """Three figures between 0.1 and 10 s, where floors are compared (0.634 s against
    0.256 s); milliseconds, minutes and hours as :func:`seconds` gives them."""
    return f"{value:.3g} s" if 0.095 <= value < 10 else seconds(value)


def projection_lines(p: Projection) -> list[str]:
    per_day = f"{p.runs_per_day:,.0f} runs/day" if p.runs_per_day else "no runs/day figure"
    floors = ", ".join(
        f"{limit_name(p, k)} {_duration(v)}" for k, v in p.limits.items() if v is not None
    )
    lines = [
        f"  {p.fleet.label}: {_duration(p.wall_seconds)}, {usd(p.cost_usd)}, {per_day} "
        f"({count(p.tasks, 'task')}); bound by {limit_name(p, p.binding, full=True)}",
        f"    floors: {floors}",
    ]
    lines.extend(f"    note: {note}" for note in p.notes)
    return lines
