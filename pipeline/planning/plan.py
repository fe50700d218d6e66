"""How a job's units are split into tasks, and the record that keeps the split fixed.

The split follows the cost model of :mod:`pipeline.planning.sizing`, measured on the job's
own first tasks, the *probes*: a round of one small task per worker (which also
warms each worker up: its time is not used), then rounds giving each worker a
large task (16 units or shards, then aimed so its per-unit part clearly
outweighs the fixed part) and a small one (one unit, or one shard), for two
rounds at least and until the largest probe's time beyond reading lasts
:data:`.probe_sizes.PROBE_SECONDS` and twice the fixed part.
Sizes far apart separate a task's fixed cost from its cost per unit. Probes are
real tasks whose output is kept, so no work is done twice. A job of at most
:data:`.probe_sizes.SMALL_JOB_UNITS_PER_WORKER` units per worker is not probed: it runs as one
round of one task per worker.

Output keys derive from task indices, so the split is recorded in the job's
``job.json`` before any task of it runs (the probes' sizes before they run, the
other tasks' boundaries once measured); a resumed run replays it exactly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..contract import recorded_fingerprint
from ..errors import ConfigError
from ..layout import completed_tasks, job_record_key, read_job_record
from ..manifest import CodeStamp, code_changes, code_version, versions_record
from ..storage import Store
from ..workload import Task, Workload
from .probe_sizes import round_up


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
    #: The job's units, which the plan's tasks cover once it is sized.
    units: int = 0
    #: The job's fingerprint as recorded, made once per run: a plan is saved up to
    #: four times, and the fingerprint of a long listed grid takes seconds to make.
    fingerprint: dict | None = field(default=None, repr=False, compare=False)
    #: Each code version that made some of the job's tasks -> its code settings'
    #: values (:mod:`pipeline.manifest`).
    code_versions: dict[str, dict] = field(default_factory=dict, compare=False)
    #: Whether this run's code settings differ from the record's (a ``keep_done``
    #: run): the run records its own fingerprint before any task runs.
    code_changed: bool = field(default=False, compare=False)
    #: The code version this run's tasks record (None without a store).
    code: CodeStamp | None = field(default=None, repr=False, compare=False)

    @property
    def sized(self) -> bool:
        return self.stops is not None or bool(self.units_per_task)

    @property
    def tasks(self) -> list[Task]:
        """The probes, then the tasks the stops end (or of ``units_per_task`` units)."""
        if self.stops is not None:
            return tasks_from_stops(self.head, self.stops)
        return plan_tasks(self.units, self.units_per_task, self.head)

    @classmethod
    def from_record(cls, record: dict, units: int | None = None) -> Plan:
        """The plan a job's record (``job.json``) holds, for a job of ``units`` (by
        default as recorded: a format-1 record may not say)."""
        return cls(
            list(record.get("head") or []),
            record.get("units_per_task"),
            record.get("stops"),
            record.get("cost_model"),
            units if units is not None else record["units"],
            code_versions=dict(record.get("code_versions") or {}),
        )

    def add_probes(self, sizes: list[int]) -> list[Task]:
        """Append probe tasks of ``sizes`` units; return them."""
        first = len(self.head)
        self.head.extend(sizes)
        return plan_tasks(sum(self.head), None, self.head)[first:]

    @property
    def typical_size(self) -> int:
        """The median size of the tasks after the probes (0 while not sized)."""
        sizes = sorted(len(t.units) for t in self.tasks[len(self.head) :])
        return sizes[len(sizes) // 2] if sizes else 0


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
    # Read first, then compared: the job's record (its format checked), its fingerprint
    # (made once: a long listed grid's takes seconds) and the code versions of both.
    record = recorded = None
    if store is not None and store.exists(key):
        record = read_job_record(store, key)
        where = store.describe(workload.job_id)
        fmt = record.get("plan_format", 1)
        if not isinstance(fmt, int) or fmt > PLAN_FORMAT:
            raise ConfigError(
                f"{where}/job.json has plan format {fmt!r}, newer than this version reads "
                f"(up to {PLAN_FORMAT}); resume with a newer pipeline, or use --overwrite"
            )
        recorded = record.get("fingerprint", {})
    current = recorded_fingerprint(workload) if store is not None else None
    free = set(workload.resume_may_change)
    # (A key the record lacks is one an older version did not record: not compared.)
    changed = sorted(
        k for k in recorded or () if k not in free and recorded.get(k) != current.get(k)
    )
    code, meaning = code_changes(changed, workload.code_settings)
    versions = {} if store is None else versions_record(
        record and record.get("code_versions"), recorded, current, workload.code_settings
    )  # fmt: skip
    stamp = None if store is None else CodeStamp(
        code_version(current, workload.code_settings), len(versions) > 1
    )  # fmt: skip
    if record is None:
        plan = Plan(units_per_task=requested, units=workload.n_units, code=stamp)
        if store is not None:
            plan.fingerprint = current
            plan.code_versions = versions
        if requested:
            save_plan(workload, store, plan)
        return plan
    if meaning or (code and not keep_done):
        raise ConfigError(_refusal(workload, where, changed, meaning))
    plan = Plan.from_record(record, workload.n_units)
    plan.fingerprint = current
    plan.code_changed = bool(code)
    plan.code_versions = versions
    plan.code = stamp
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
            else f"measured task sizes (about {plan.typical_size} units)"
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
    return [t for t in Plan.from_record(record).tasks if t.index not in done]


def save_plan(workload: Workload, store: Store | None, plan: Plan) -> None:
    """Record ``plan`` (loaded by :func:`load_plan`, which made its fingerprint) before
    any task it adds runs."""
    if store is None:
        return
    record = {
        "plan_format": PLAN_FORMAT,
        "workload": workload.kind,
        "job_id": workload.job_id,
        "fingerprint": plan.fingerprint,
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


def mark_code_version(workload: Workload, store: Store, plan: Plan) -> CodeStamp:
    """Before any task runs: the code version the workers record in each task's entry
    (:func:`pipeline.manifest.stamp_entry`), returned, and a changed one recorded in
    the job's record (its fingerprint, which the next run compares, and its settings)."""
    if plan.code_changed:
        save_plan(workload, store, plan)
        plan.code_changed = False
    return plan.code
