"""``pipeline estimate``: run a job's probe tasks into a scratch output, then project.

The probes are the planner's own (:func:`pipeline.planning.probes.probe`): rounds of a
small and a large task per worker until the cost model (fixed + per-unit
seconds per task) is measured; then one round of tasks of the size the run will
use, one per worker, whose rate replaces the per-unit seconds (the probes'
largest last about 0.1 s: too short to see a steady state). They write into a
scratch folder (or, for an ``s3://`` output, a scratch prefix beside it, which a
remote cluster's workers can reach), deleted afterwards: the job's own output is never touched. The
model then projects the whole job on this cluster and on each fleet
(:func:`pipeline.costs.run_cost.project`).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..cluster.connect import count_workers
from ..config import RunOptions
from ..contract import preflight
from ..errors import PipelineError
from ..joblib.job_runner import JobRunner
from ..planning.plan import Plan, load_plan
from ..planning.probe_sizes import is_small_job
from ..planning.probes import probe
from ..planning.sizing import CostModel, ProbeSample, fit_costs, unit_layout
from ..runner.output import open_output
from ..storage import is_remote, open_store
from ..summary import TaskTime, count
from ..workload import Workload, unit_label
from .prices import worker_price
from .run_cost import Fleet, JobSample, Projection, project, projection_lines

__all__ = ["Estimate", "estimate", "estimate_lines"]


@dataclass
class Estimate:
    job_id: str
    workload: str
    unit_name: str
    units: int
    workers: int
    sample: JobSample
    projections: list[Projection]
    #: Units the estimate ran: the probes' and full-size tasks spread over the job.
    sampled: int = 0
    #: Of those, units that failed; and the first, as text.
    failed: int = 0
    failure: str = ""


class _NoBar:
    def update(self, units: int, failed: int = 0) -> None:
        pass


@contextlib.contextmanager
def scratch_output(output: str) -> Iterator[str]:
    """A scratch output beside ``output`` (a temporary folder for a local one), deleted
    on leaving. Enter it before the cluster it is written from, so that it is deleted
    after the cluster stops: tasks still running at an interrupt would write into it
    again."""
    if is_remote(output):
        url = f"{output.rstrip('/')}/_pipeline-estimate-{uuid.uuid4().hex[:12]}"
        try:
            yield url
        finally:
            open_store(url).delete_prefix("")
    else:
        with tempfile.TemporaryDirectory(prefix="pipeline-estimate-") as folder:
            yield folder


def estimate(
    build: Callable[[RunOptions], Workload],
    options: RunOptions,
    client,
    fleets: list[Fleet],
    scratch: str | None = None,
) -> Estimate:
    """Probe the job ``build(options)`` makes, on ``client``'s cluster, into a scratch
    output (``scratch``, else one of :func:`scratch_output`); return its projections on
    this cluster and on ``fleets``."""
    price = worker_price(options)
    place = contextlib.nullcontext(scratch) if scratch else scratch_output(options.output)
    with place as scratch, contextlib.ExitStack() as stack:
        opts = dataclasses.replace(options, output=scratch, overwrite=True, progress=False)
        workload = build(opts)
        preflight(workload)
        store = open_output(workload, opts, echo=lambda m: None)
        n, workers = workload.n_units, count_workers(client)
        workload.prepare_cluster(client)
        run = stack.enter_context(JobRunner(workload, store, client, _NoBar()))
        plan = load_plan(workload, None, store)
        layout = unit_layout(workload)
        t0 = time.perf_counter()
        small = is_small_job(n, workers)
        if small:
            # Too small to probe: one task per unit on this cluster is the sample.
            receipts = run(plan.add_probes([1] * n))
        else:
            # One round may do: the estimate keeps none of the probes' work.
            receipts, _ = probe(
                run, plan, set(), opts, workers, layout, start_rest=False, min_rounds=1
            )
        seconds = time.perf_counter() - t0
        # Tasks of the size the run will use, two per worker: the probes' largest
        # last about PROBE_SECONDS, and a rate taken over full-size tasks carries
        # what small ones miss (a cache filling up, a slower steady
        # state). Spread over the job: units often cost more further on (a grid's
        # later sizes, a dataset's later years), and the probes ran its first ones;
        # two samples of the rest missed a costlier last quarter.
        count = FULL_SIZE_TASKS_PER_WORKER * workers
        full = _spread(plan.tasks[len(plan.head) :], count) if plan.model else []
        if count * plan.typical_size > n / 2:
            full = []  # a job of a few large tasks: those would be much of it
        receipts += run(full)
        failed = [f for r in receipts for f in r.failures]
        if failed and not any(r.complete for r in receipts):
            f = failed[0]
            raise PipelineError(
                f"estimate: every probe task failed ({len(failed)} units), e.g. "
                f"{workload.unit_name} {f.unit}: {f.error_type}: {f.message}"
            )
        # Units that failed as data, in tasks that completed: their time is a failure's
        failed += [f for r in receipts if r.complete for f in r.recorded or ()]
        ran = sum(r.units for r in receipts)
        # the example is the first unit, whatever order the tasks finished in
        failed.sort(key=lambda f: (not isinstance(f.unit, int), str(f.unit).zfill(20)))
        if failed and len(failed) >= ran:
            raise PipelineError(
                f"estimate: every {workload.unit_name} the probes ran failed ({len(failed)} of "
                f"{ran}), e.g. {_failure_text(workload.unit_name, failed[0])}; an estimate "
                "would time the failures, not the work"
            )
        objects = 0
        if store is not None:
            objects = sum(
                1
                for key in store.list(workload.job_id)
                if "/manifest" not in key and not key.endswith("job.json")
            )
        if plan.model:
            model = CostModel(**plan.model)
            if full:  # (receipts[-0:] would be all of them, the workers' cold first tasks too)
                model = _refit(model, receipts[-len(full) :], plan, layout)
        else:
            model = _fallback_model(receipts, plan, layout)
        done = [r for r in receipts if r.complete]
        units = max(1, sum(r.units for r in done))
        probing = receipts[: len(receipts) - len(full)]
        sized = [r for r in receipts[len(probing) :] if r.complete]
        s3 = is_remote(opts.output)
        sample = JobSample(
            model,
            sum(r.units for r in probing),
            seconds,
            bytes_written_per_unit=sum(r.bytes_written for r in done) / units,
            bytes_read_per_unit=sum(r.bytes_read for r in done) / units,
            objects_per_unit=objects / units,
            workers=workers,
            probed=not small and not options.units_per_task,
            probe_tasks=len(probing),
            spent=TaskTime.of([r for r in probing if r.complete], s3=s3),
            steady=TaskTime.of(sized, s3=s3) if sized else None,
            writes_output=store is not None,
        )
        here = Fleet(
            None,
            1,
            workers,
            workers * price.usd_per_hour,
            f"this cluster ({workers} workers at ${price.usd_per_hour:.4f}/worker-hour, "
            f"{price.basis})",
            s3=s3,
        )
        projections = [
            project(layout, sample, f, options.task_seconds, options.units_per_task)
            for f in (here, *fleets)
        ]
    return Estimate(
        workload.job_id, workload.kind, workload.unit_name, n, workers, sample, projections,
        units, len(failed), _failure_text(workload.unit_name, failed[0]) if failed else "",
    )  # fmt: skip


def _failure_text(unit_name: str, f) -> str:
    return f"{unit_name} {unit_label(f.unit, f.key)}: {f.error_type}: {f.message}"


#: Full-size tasks an estimate runs per worker, spread over the job.
FULL_SIZE_TASKS_PER_WORKER = 2


def _spread(tasks: list, count: int) -> list:
    """Up to ``count`` of ``tasks`` (consecutive), those holding the middles of
    ``count`` equal stretches of their units."""
    if not tasks:
        return []
    start, stop = tasks[0].start, tasks[-1].stop
    stops = [t.stop for t in tasks]
    picked: dict[int, object] = {}  # by position, in order
    for i in range(count):
        middle = start + (i + 0.5) * (stop - start) / count
        at = bisect.bisect_right(stops, middle)
        picked.setdefault(at, tasks[at])
    return list(picked.values())


def _refit(model: CostModel, receipts, plan: Plan, layout) -> CostModel:
    """``model``'s per-unit seconds, its fixed part kept: the probes' for the units they
    ran, the full-size tasks' rate (a sample of the rest) for the others."""
    ranges = {t.index: (t.start, t.stop) for t in plan.tasks}
    timed = [r for r in receipts if r.complete and r.units]
    weight = sum(layout.weight(*ranges[r.index]) for r in timed)
    if not timed or weight <= 0:
        return model
    work = sum(r.seconds - model.fixed - model.per_byte * r.bytes_read for r in timed)
    probed = layout.weight(0, sum(plan.head)) / max(layout.weight(0, layout.n), 1e-12)
    per_unit = probed * model.per_unit + (1 - probed) * max(work / weight, 1e-9)
    return dataclasses.replace(model, per_unit=per_unit)


def _fallback_model(receipts, plan: Plan, layout) -> CostModel:
    """A model from tasks of one size (a job too small to probe): all per unit."""
    ranges = {t.index: (t.start, t.stop) for t in plan.tasks}
    samples = [
        ProbeSample(layout.weight(*ranges[r.index]), r.seconds, r.read_seconds, r.bytes_read)
        for r in receipts
        if r.complete and r.units
    ]
    return fit_costs(samples) if samples else CostModel(0.0, 1e-9)


def estimate_lines(e: Estimate) -> list[str]:
    s, m = e.sample, e.sample.model
    more = e.sampled - s.units
    lines = [
        f"estimate of {e.workload} job {e.job_id!r}: {count(e.units, e.unit_name)}; the probes ran "
        f"{s.units:,} of them in {s.seconds:.1f} s on {e.workers} workers"
        + (f", and {more:,} more in full-size tasks spread over the job" if more else "")
        + " (scratch output, deleted)",
        f"  measured: {m.fixed * 1e3:,.1f} ms per task + {m.per_unit * 1e3:,.3f} ms per "
        f"{e.unit_name}"
        + (f" + {m.per_byte * 1e9:,.2f} s per GB read" if m.per_byte > 0 else "")
        + f"; {s.bytes_written_per_unit / 1e3:,.1f} kB and "
        f"{s.objects_per_unit:.2f} objects written per {e.unit_name}",
    ]
    if e.failed:
        lines.append(
            f"  warning: {e.failed:,} of the {max(e.sampled, s.units):,} {e.unit_name}s it ran "
            f"failed, and their time is in the figures below: {e.failure}"
        )
    for p in e.projections:
        lines.extend(projection_lines(p))
    return lines
