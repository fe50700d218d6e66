"""How a job's units are split into tasks, and the record that keeps the split fixed.

A task should last about ``task_seconds``: long enough that the scheduler's
per-task overhead is noise, short enough to balance the load. The rate that
decides this is measured on the job's own first tasks, the *probes*: a round of
small tasks (one per worker, which also warms each worker up), then rounds of
larger ones until a round lasts :data:`PROBE_SECONDS`. Probes are real tasks
whose output is kept, so no work is done twice to size the rest.

Output keys derive from task indices, so the split is recorded in the job's
``job.json`` before any task of it runs; a resumed run replays it exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .errors import ConfigError
from .storage import Store, join
from .workload import Task, Workload, plan_tasks

#: Probing stops after a round (not a worker's first) whose tasks lasted this long.
PROBE_SECONDS = 0.1
#: At least this many tasks per worker, so the last tasks do not leave workers idle.
MIN_TASKS_PER_WORKER = 4


@dataclass
class Plan:
    """The first tasks' sizes (the probes), then ``units_per_task`` for the rest."""

    head: list[int] = field(default_factory=list)
    #: None while the probes have not measured the rate yet.
    units_per_task: int | None = None

    def tasks(self, n_units: int) -> list[Task]:
        return plan_tasks(n_units, self.units_per_task, self.head)

    def add_probes(self, sizes: list[int]) -> list[Task]:
        """Append probe tasks of ``sizes`` units; return them."""
        first = len(self.head)
        self.head.extend(sizes)
        return plan_tasks(sum(self.head), None, self.head)[first:]


def job_record_key(job_id: str) -> str:
    return join(job_id, "job.json")


def load_plan(workload: Workload, requested: int | None, store: Store | None) -> Plan:
    """The recorded plan when the output holds this job, else the requested units per
    task (``--units-per-task``), else an empty plan for the probes to fill. A plan
    that ``requested`` completes is recorded here; a recorded one is not rewritten."""
    g = workload.granularity
    requested = round_up(requested, g) if requested else None
    key = job_record_key(workload.job_id)
    if store is None or not store.exists(key):
        plan = Plan(units_per_task=requested)
        if requested:
            save_plan(workload, store, plan)
        return plan
    record = json.loads(store.read_bytes(key))
    recorded, current = record.get("fingerprint", {}), workload.fingerprint()
    if recorded != current:
        changed = sorted(k for k in recorded.keys() | current if recorded.get(k) != current.get(k))
        raise ConfigError(
            f"{store.describe(workload.job_id)} holds job {workload.job_id!r} with other "
            f"settings ({', '.join(changed)}); use --overwrite to replace it, or another "
            "--output or name"
        )
    plan = Plan(list(record.get("head", [])), record.get("units_per_task"))
    if requested and plan.units_per_task and requested != plan.units_per_task:
        raise ConfigError(
            f"--units-per-task {requested}: the output at {store.describe(workload.job_id)} "
            f"was planned with {plan.units_per_task} units per task; resume with that, "
            "or use --overwrite"
        )
    if requested and not plan.units_per_task:
        plan.units_per_task = requested
        save_plan(workload, store, plan)
    return plan


def save_plan(workload: Workload, store: Store | None, plan: Plan) -> None:
    """Record ``plan`` before any task it adds runs."""
    if store is None:
        return
    record = {
        "workload": workload.kind,
        "job_id": workload.job_id,
        "fingerprint": workload.fingerprint(),
        "head": plan.head,
        "units_per_task": plan.units_per_task,
        "units": workload.n_units,
    }
    store.write_bytes(
        job_record_key(workload.job_id), json.dumps(record, indent=2, sort_keys=True).encode()
    )


def balance_limit(n_units: int, n_workers: int, granularity: int = 1) -> int:
    """The largest task that still gives every worker several tasks."""
    return round_up(max(1, math.ceil(n_units / (n_workers * MIN_TASKS_PER_WORKER))), granularity)


def probe_size(seconds_per_unit: float | None, previous: int, limit: int, granularity: int) -> int:
    """Units for the next round of probes: aimed just past :data:`PROBE_SECONDS`
    (growing by a fixed factor would overshoot it by up to that factor, and
    probes are short tasks), at most 100x the last and never past ``limit``."""
    if seconds_per_unit is None:
        return min(granularity, limit)
    aim = math.ceil(round(1.5 * PROBE_SECONDS / max(seconds_per_unit, 1e-9), 6))
    return max(granularity, min(round_up(min(aim, 100 * previous), granularity), limit))


def size_tasks(
    seconds_per_unit: float,
    n_units: int,
    n_workers: int,
    task_seconds: float,
    granularity: int = 1,
) -> int:
    """Units per task (a multiple of ``granularity``) so a task lasts about
    ``task_seconds``, with enough tasks to keep every worker busy, and the tasks
    falling into whole rounds of ``n_workers`` so no worker idles at the end."""
    by_time = max(1, round(task_seconds / max(seconds_per_unit, 1e-9)))
    longest = min(round_up(by_time, granularity), balance_limit(n_units, n_workers, granularity))

    def finish(units_per_task: int) -> int:
        # Units done by the busiest worker when tasks of equal speed are handed out in
        # rounds: the run's wall time, in units.
        rounds = math.ceil(math.ceil(n_units / units_per_task) / n_workers)
        return rounds * units_per_task

    # Shorter tasks cost scheduler overhead, so look no lower than half the longest.
    candidates = range(longest, max(granularity, longest // 2) - 1, -granularity)
    best = min(finish(u) for u in candidates)
    # Of the near-best, the longest: fewer tasks for the same finish.
    return next(u for u in candidates if finish(u) <= best * 1.01)


def round_up(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple
