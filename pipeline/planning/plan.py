"""How a job's units are split into tasks, and the record that keeps the split fixed.

The split follows the cost model of :mod:`pipeline.planning.sizing`, measured on the job's
own first tasks, the *probes*: a round of one small task per worker (which also
warms each worker up: its time is not used), then rounds giving each worker a
large task (16 units or shards, then aimed so its per-unit part clearly
outweighs the fixed part) and a small one (one unit, or one shard), for two
rounds at least and until the largest probe's time beyond reading lasts
:data:`PROBE_SECONDS` and twice the fixed part.
Sizes far apart separate a task's fixed cost from its cost per unit. Probes are
real tasks whose output is kept, so no work is done twice. A job of at most
:data:`SMALL_JOB_UNITS_PER_WORKER` units per worker is not probed: it runs as one
round of one task per worker.

Output keys derive from task indices, so the split is recorded in the job's
``job.json`` before any task of it runs (the probes' sizes before they run, the
other tasks' boundaries once measured); a resumed run replays it exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..contract import recorded_fingerprint
from ..errors import ConfigError
from ..layout import completed_tasks, job_record_key, read_job_record
from ..manifest import code_changes, code_version, versions_record
from ..storage import Store
from ..workload import Task, Workload
from .sizing import (
    MIN_TASKS_PER_WORKER,
    CostModel,
    UnitLayout,
    cut_tasks,
    make_layout,
    task_rounds,
)


def plan_tasks(n_units: int, units_per_task: int | None, head: Sequence[int] = ()) -> list[Task]:
    """Tasks of ``head[i]`` units first (the probes that measured the rate), then of
    ``units_per_task`` up to ``n_units`` (none while that is not known yet)."""
    tasks, start = [], 0
    for size in head:
        tasks.append(Task(len(tasks), start, start + size))
        start += size
    if units_per_task:
        for first in range(start, n_units, units_per_task):
            tasks.append(Task(len(tasks), first, min(n_units, first + units_per_task)))
    return tasks


def tasks_from_stops(head: Sequence[int], stops: Sequence[int]) -> list[Task]:
    """Tasks of ``head[i]`` units first (the probes), then tasks ending at ``stops``."""
    tasks = plan_tasks(sum(head), None, head)
    start = sum(head)
    for stop in stops:
        tasks.append(Task(len(tasks), start, stop))
        start = stop
    return tasks


#: Probing stops once the large probes' per-unit part lasts this long (and the fixed part).
PROBE_SECONDS = 0.1
#: The first large probe, in units (or shards) of the small one.
LARGE_PROBE_FACTOR = 16
#: The next large probe is aimed at this many times PROBE_SECONDS (or the fixed part):
#: the first round's per-unit estimate (16 units against 1) can be several times too
#: high, and a probe aimed at 1.5x fell short of PROBE_SECONDS often enough that a
#: short job paid a third round (a probe is useful work: a longer one costs nothing).
PROBE_AIM = 4.0
#: Jobs of at most this many units per worker run as one round, unprobed.
SMALL_JOB_UNITS_PER_WORKER = 32
#: The job.json plan formats this version reads (1: head + units_per_task; 2: + stops).
PLAN_FORMAT = 2


@dataclass
class Plan:
    """The probes' sizes (``head``), then either the measured tasks' ``stops`` (unit
    index where each ends) or a fixed ``units_per_task`` (``--units-per-task``)."""

    head: list[int] = field(default_factory=list)
    units_per_task: int | None = None
    stops: list[int] | None = None
    #: The cost model that chose ``stops`` (recorded for the reader, not replayed).
    model: dict[str, Any] | None = None
    #: The job's fingerprint as recorded, made once per run: a plan is saved up to
    #: four times, and the fingerprint of a long listed grid takes seconds to make.
    fingerprint: dict | None = field(default=None, repr=False, compare=False)
    #: Each code version that made some of the job's tasks -> its code settings'
    #: values (:mod:`pipeline.manifest`).
    code_versions: dict[str, dict] = field(default_factory=dict, compare=False)
    #: Whether this run's code settings differ from the record's (a ``keep_done``
    #: run): the run records its own fingerprint before any task runs.
    code_changed: bool = field(default=False, compare=False)

    @property
    def sized(self) -> bool:
        return self.stops is not None or bool(self.units_per_task)

    def tasks(self, n_units: int) -> list[Task]:
        if self.stops is not None:
            return tasks_from_stops(self.head, self.stops)
        return plan_tasks(n_units, self.units_per_task, self.head)

    @classmethod
    def from_record(cls, record: dict) -> Plan:
        """The plan a job's record (``job.json``) holds."""
        return cls(
            list(record.get("head") or []),
            record.get("units_per_task"),
            record.get("stops"),
            record.get("cost_model"),
            code_versions=dict(record.get("code_versions") or {}),
        )

    def add_probes(self, sizes: list[int]) -> list[Task]:
        """Append probe tasks of ``sizes`` units; return them."""
        first = len(self.head)
        self.head.extend(sizes)
        return plan_tasks(sum(self.head), None, self.head)[first:]

    def typical_size(self, n_units: int) -> int:
        """The median size of the tasks after the probes (0 while not sized)."""
        sizes = sorted(len(t.units) for t in self.tasks(n_units)[len(self.head) :])
        return sizes[len(sizes) // 2] if sizes else 0


def unit_layout(workload: Workload) -> UnitLayout:
    """The planner's view of the workload's units: boundaries, weights, bytes read."""
    return make_layout(
        workload.n_units,
        workload.granularity,
        workload.natural_boundaries(),
        workload.unit_weights(),
        workload.read_bytes,
    )


def load_plan(
    workload: Workload, requested: int | None, store: Store | None, keep_done: bool = False
) -> Plan:
    """The recorded plan when the output holds this job, else the requested units per
    task (``--units-per-task``), else an empty plan for the probes to fill. A plan
    that ``requested`` completes is recorded here; a recorded one is not rewritten.
    With ``keep_done``, the workload's code settings may differ from the record's
    (``plan.code_changed``; the runner records the new ones)."""
    g = workload.granularity
    asked = f"{requested}" if not requested or requested % g == 0 else (
        f"{requested} (rounded up to {round_up(requested, g)}, whole groups of {g} units)"
    )  # fmt: skip
    requested = requested_units_per_task(requested, g)
    key = job_record_key(workload.job_id)
    if store is None or not store.exists(key):
        plan = Plan(units_per_task=requested)
        if store is not None:
            plan.fingerprint = recorded_fingerprint(workload)
            plan.code_versions = versions_record(
                None, None, plan.fingerprint, workload.code_settings
            )
        if requested:
            save_plan(workload, store, plan)
        return plan
    record = read_job_record(store, key)
    where = store.describe(workload.job_id)
    fmt = record.get("plan_format", 1)
    if not isinstance(fmt, int) or fmt > PLAN_FORMAT:
        raise ConfigError(
            f"{where}/job.json has plan format {fmt!r}, newer than this version reads "
            f"(up to {PLAN_FORMAT}); resume with a newer pipeline, or use --overwrite"
        )
    recorded, current = record.get("fingerprint", {}), recorded_fingerprint(workload)
    free = set(workload.resume_may_change)
    # (A key the record lacks is one an older version did not record: not compared.)
    changed = sorted(k for k in recorded if k not in free and recorded.get(k) != current.get(k))
    code, meaning = code_changes(changed, workload.code_settings)
    if meaning or (code and not keep_done):
        raise ConfigError(_refusal(workload, where, changed, meaning))
    plan = Plan.from_record(record)
    plan.fingerprint = current
    plan.code_changed = bool(code)
    plan.code_versions = versions_record(
        plan.code_versions, recorded, current, workload.code_settings
    )
    if plan.stops is not None and (
        sum(plan.head) > workload.n_units or (plan.stops and plan.stops[-1] != workload.n_units)
    ):
        raise ConfigError(
            f"{where}/job.json: its tasks end at unit {plan.stops[-1]}, but the job has "
            f"{workload.n_units} units; use --overwrite"
        )
    if requested and plan.sized and requested != plan.units_per_task:
        was = (
            f"{plan.units_per_task} units per task"
            if plan.stops is None
            else f"measured task sizes (about {plan.typical_size(workload.n_units)} units)"
        )
        raise ConfigError(
            f"--units-per-task {asked}: the output at {where} was planned with {was}; "
            "resume without a different --units-per-task, or use --overwrite"
        )
    if requested and not plan.sized:
        plan.units_per_task = requested
        save_plan(workload, store, plan)
    return plan


def _refusal(workload: Workload, where: str, changed: list[str], meaning: list[str]) -> str:
    """Why a resume is refused: settings that changed since the job's record. When
    they are its code alone, ``--keep-done`` runs the rest with the new code."""
    # Input versions follow from other settings (another --frames, another dim):
    # only alone do they mean the same inputs' files changed.
    settings = [k for k in changed if not k.endswith("versions")]
    what = (
        f"with other settings ({', '.join(settings)})"
        if settings
        else "whose input files changed since (their sizes, times or S3 ETags)"
    )
    said = f"{where} holds job {workload.job_id!r} {what}; "
    if not meaning:
        return said + (
            "use --keep-done to keep the units done and run the failed and missing ones "
            "with the new code (keep_done = true in a job file, keep_done=True from "
            "Python), --overwrite to redo every unit, or another --output or name"
        )
    code = [k for k in changed if k in workload.code_settings]
    decide = ", ".join(k for k in meaning if not k.endswith("versions")) or "the inputs' files"
    kept = (
        f" (--keep-done keeps the units done where only the code differs ({', '.join(code)}), "
        f"not {decide}: what the units mean)"
        if code
        else ""
    )
    return said + f"use --overwrite to replace it, or another --output or name{kept}"


def requested_units_per_task(requested: int | None, granularity: int) -> int | None:
    """``--units-per-task`` as tasks are cut with it: rounded up to whole groups of
    ``granularity`` units (a cube job's shards), None when not given."""
    return round_up(requested, granularity) if requested else None


def missing_tasks(store: Store, job_id: str, record: dict) -> list[Task]:
    """The tasks the job's record plans that have not written their manifest entry:
    what its next run runs, and what its tables lack."""
    done = completed_tasks(store, job_id)
    return [t for t in Plan.from_record(record).tasks(record["units"]) if t.index not in done]


def save_plan(workload: Workload, store: Store | None, plan: Plan) -> None:
    """Record ``plan`` before any task it adds runs."""
    if store is None:
        return
    record = {
        "plan_format": PLAN_FORMAT,
        "workload": workload.kind,
        "job_id": workload.job_id,
        "fingerprint": plan.fingerprint or recorded_fingerprint(workload),
        "head": plan.head,
        "units_per_task": plan.units_per_task,
        "stops": plan.stops,
        "cost_model": plan.model,
        "units": workload.n_units,
    }
    if plan.code_versions:
        record["code_versions"] = plan.code_versions
    store.write_bytes(
        job_record_key(workload.job_id), json.dumps(record, indent=2, sort_keys=True).encode()
    )


def mark_code_version(workload: Workload, store: Store, plan: Plan) -> None:
    """Before any task runs: the code version the workers record in each task's entry
    (:func:`pipeline.manifest.stamp_entry`), and a changed one recorded in the
    job's record (its fingerprint, which the next run compares, and its settings)."""
    workload.code_version = code_version(plan.fingerprint, workload.code_settings)
    workload.code_changed_before = len(plan.code_versions) > 1
    if plan.code_changed:
        save_plan(workload, store, plan)
        plan.code_changed = False


def is_small_job(n_units: int, n_workers: int) -> bool:
    """Too small to probe: a round of probes would be a good part of the job."""
    return n_units <= SMALL_JOB_UNITS_PER_WORKER * n_workers


def probe_limit(n_units: int, n_workers: int, granularity: int = 1) -> int:
    """The largest probe: one that still leaves every worker several tasks' worth."""
    per_task = math.ceil(n_units / (n_workers * MIN_TASKS_PER_WORKER))
    return round_up(max(1, per_task), granularity)


def next_large_probe(
    per_unit: float, fixed: float, previous: int, limit: int, granularity: int
) -> int:
    """Units for the next large probe: aimed so its per-unit part lasts :data:`PROBE_AIM`
    times the more of :data:`PROBE_SECONDS` and the fixed part, at least 2x and at most
    100x the last, never past ``limit``. A last probe whose per-unit part was smaller
    than its fixed part measured little but noise for the slope: 100x then (its
    per-unit part stays under 100x the fixed part)."""
    aim = math.ceil(round(PROBE_AIM * max(PROBE_SECONDS, fixed) / max(per_unit, 1e-9), 6))
    if per_unit * previous < fixed:
        aim = 100 * previous
    size = min(max(aim, 2 * previous), 100 * previous)
    return max(granularity, min(round_up(size, granularity), limit))


def cut_is_settled(
    layout: UnitLayout, start: int, model: CostModel, n_workers: int, task_seconds: float
) -> bool:
    """Whether a more precise model would not change the plan that matters, with the
    per-unit cost anywhere from half to twice ``model``'s: units ``start..`` are cut
    into as many tasks, or make a small job whichever (a few short tasks a worker,
    whose count only moves their length between ``SHORT_TASK_SECONDS`` and half a
    target). A probe round more would then be only a barrier more."""
    rounds, small = task_rounds(layout, start, model, n_workers, task_seconds)
    count = len(cut_tasks(layout, start, model, n_workers, task_seconds, rounds))
    for factor in (0.5, 2.0):
        scaled = replace(model, per_unit=model.per_unit * factor, per_byte=model.per_byte * factor)
        rounds, scaled_small = task_rounds(layout, start, scaled, n_workers, task_seconds)
        if small and scaled_small:
            continue
        if len(cut_tasks(layout, start, scaled, n_workers, task_seconds, rounds)) != count:
            return False
    return True


def probe_round(small: int | None, large: int, n_workers: int, left: int) -> list[int]:
    """A round of probes: one large task per worker, then one ``small`` per worker
    (none if None), cut to the ``left`` units. Large ones first: each worker then
    takes one of each, and none idles while another finishes its large one."""
    sizes, used = [], 0
    for want in [large] * n_workers + [small] * (n_workers if small else 0):
        take = min(want, left - used)
        if take <= 0:
            break
        sizes.append(take)
        used += take
    return sizes


def aligned_probes(layout: UnitLayout, at: int, sizes: list[int]) -> list[int]:
    """``sizes`` (large probes from unit ``at`` on), each moved to end on the natural
    boundary nearest its wanted end when that is within half its size: a probe
    that stops inside a row group leaves the rest of the group for the next task
    to read again (on S3, a second request for the same bytes)."""
    out = []
    for want in sizes:
        if at >= layout.n:
            break
        want = min(want, layout.n - at)
        size = layout.snap(at, layout.weight(0, at) + want) - at
        if not want / 2 <= size <= 1.5 * want:
            size = want
        out.append(size)
        at += size
    return out


def round_up(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple
