"""The probes: a job's first tasks, run in rounds to measure its cost model, then
the rest of the job cut into tasks by it (see docs/planning.md)."""

from __future__ import annotations

import collections
import itertools
import logging
import math
import statistics
from dataclasses import asdict

from ..config import RunOptions
from ..dispatch.launch import Launcher
from ..dispatch.receipts import TaskReceipt
from .plan import Plan, save_plan
from .probe_sizes import (
    LARGE_PROBE_FACTOR,
    PROBE_SECONDS,
    aligned_probes,
    cut_is_settled,
    is_small_job,
    next_large_probe,
    probe_limit,
    probe_round,
    round_up,
)
from .scheduler_cpu import SchedulerCpu
from .sizing import (
    MIN_TASKS_PER_WORKER,
    SCHEDULER_SECONDS_PER_TASK,
    CostModel,
    ProbeSample,
    UnitLayout,
    cut_tasks,
    fit_costs,
    longest_first,
    overhead_can_bind,
    unit_layout,
)
from .tail import tapered

__all__ = ["probe"]

log = logging.getLogger(__name__)


def probe(
    run: Launcher,
    plan: Plan,
    done: set[int],
    options: RunOptions,
    n_workers: int,
    layout: UnitLayout | None = None,
    start_rest: bool = True,
    min_rounds: int = 2,
):
    """Run probe tasks until they measure the cost model, then cut the rest of ``plan``.

    Each round is waited for: its tasks' durations size the next. A worker's first
    task also loads its inputs, so the first round of this run starts with one small
    task per worker, a warm-up left out of the fit (each worker's first task to
    start is), then a large and a small task for every other worker; the later
    rounds give each worker a large task. The scheduler's CPU per task is read while
    the first round runs (:class:`SchedulerCpu`) where it could bind.
    ``layout``: the workload's :func:`unit_layout`, if the caller has it already.
    ``min_rounds``: measured rounds before the probes may stop (an estimate, whose
    probes' work is not kept, takes one when it measured enough).
    Returns the probes' receipts, and with ``start_rest`` the rest's tasks started,
    their receipts as they come (None when the caller is to start them: a small
    job's, or all without ``start_rest``).
    """
    workload, n = run.workload, run.workload.n_units
    g = workload.granularity
    layout = layout or unit_layout(workload)
    if not plan.head and is_small_job(n, n_workers):
        plan.stops = cut_tasks(layout, 0, CostModel(0.0, 1.0), n_workers, 1.0, rounds=1)
        save_plan(workload, run.store, plan)
        log.info("small job: %d %ss in %d tasks, unprobed", n, workload.unit_name, len(plan.stops))
        return [], None
    limit = max(g, probe_limit(n, n_workers, g))
    large = min(limit, LARGE_PROBE_FACTOR * g)
    # Probes an interrupted run recorded but did not finish come first (a warm-up).
    round_ = [t for t in plan.tasks if t.index not in done]
    receipts: list[TaskReceipt] = []
    samples: list[ProbeSample] = []
    overhead = SCHEDULER_SECONDS_PER_TASK
    # Measured while the first round runs, where it could bind (no tasks of its own).
    clock = SchedulerCpu(run.client, overhead_can_bind(n_workers, options.task_seconds))
    model, rounds, first_round, cut, handover = None, 0, True, False, 0.0
    followers: list[int] = []  # the streamed first round's, after its small probes
    streamed = False  # the first round read as it comes (see _streamed_first_round)
    while True:
        left = n - sum(plan.head)
        resumed = bool(round_)
        if not round_:
            if not left:
                break
            # Small probes in the first measured round only: their fixed part stays
            # in the fit, and on S3 every task pays a request or more.
            sizes = probe_round(g if rounds == 0 else None, large, n_workers, left)
            if rounds:
                # A follower of the same size queued behind each large probe: the
                # workers keep working while the probes report and the rest is cut,
                # not idle for that round trip.
                sizes += probe_round(None, large, n_workers, left - sum(sizes))
                sizes = aligned_probes(layout, sum(plan.head), sizes)
            elif first_round:  # a warm-up per worker first: each worker's first to start
                warm_ups = [min(g, left)] * min(n_workers, math.ceil(left / g))
                # A large probe for every worker and a small one for every other: two
                # sizes to fit a line through, and rounds that differ by a small task
                # between workers. (A large and a small for only every other worker
                # would leave the others idle through the large ones.)
                rest = left - sum(warm_ups)
                larges = probe_round(None, large, n_workers, rest)
                smalls = probe_round(None, g, -(-n_workers // 2), rest - sum(larges))
                # Read as it comes where half of each size may be stuck behind slow
                # probes and the other half still measures the model.
                streamed = large > g and min(len(larges), len(smalls)) >= 2 * MANY_SAMPLES
                if streamed:
                    # Twice MANY_SAMPLES small probes are enough to fit (each a task
                    # more, whose hand-over costs its worker as much as a large one's);
                    # and a follower of half the large size for every worker: the
                    # workers keep at the job's units while the round's receipts come
                    # back, the rest is cut and its tasks reach them. (Dask hands the
                    # followers to whichever worker is free first, so some take two
                    # and some none: half a large probe is what that leaves between
                    # the workers where they start on the rest.)
                    # (No followers where no rest is started: an estimate's.)
                    smalls = smalls[: 2 * MANY_SAMPLES]
                    if start_rest:
                        # No warm-ups where followers come: each worker's large probe
                        # is its first task, left out of the fit as a warm-up is, and
                        # the smalls and the followers, two sizes run warm, fit the
                        # line. (A warm-up a worker cost each a hand-over more, all
                        # of them at once: 2-5 s of every worker's time at 500.)
                        warm_ups = []
                        used = sum(larges) + sum(smalls)
                        half = max(g, round_up(large // 2, g))
                        followers = probe_round(None, half, n_workers, left - used)
                sizes = warm_ups + larges + smalls + followers
            round_ = plan.add_probes(sizes)
            save_plan(workload, run.store, plan)
        ranges = {t.index: (t.start, t.stop) for t in round_}
        if first_round and streamed:
            got, started = _streamed_first_round(
                run, plan, round_, layout, clock, n_workers, options, start_rest, len(followers)
            )
            if started is not False:
                return receipts + got, started
        elif first_round or resumed:
            # Waited for whole: each worker's first task is told apart by its start.
            got = _gathered(run, round_, clock)
        else:
            got, counted = [], False
            # The later rounds are read as they come: once a probe settles the cut,
            # the rest starts at once, on the workers whose probes are done.
            for r in run.launch(round_):
                got.append(r)
                if cut or not (r.complete and r.units):
                    continue
                samples.append(_sample(layout, ranges, r))
                model = fit_costs(samples, overhead, handover)
                if not counted:  # the round counts from its first measured probe
                    rounds, counted = rounds + 1, True
                if _measured(samples, model, large, limit, rounds, layout, plan, n_workers,
                             options, min_rounds):  # fmt: skip
                    rest = _cut(run, plan, model, layout, n_workers, options, start_rest)
                    cut = True
            receipts += got
            round_ = []
            if cut:
                return receipts, rest
            if not any(r.complete and r.units for r in got):
                break  # nothing to measure (failed units, or the cluster failing under us)
            large = next_large_probe(model.per_unit, _fixed(model), large, limit, g)
            continue
        receipts += got
        timed = [r for r in got if r.complete and r.units]
        if clock.enabled:
            overhead = _measured_overhead(clock, overhead)
        if first_round:
            # Cold, so slower than the rest will be: left out of the fit, and only a
            # fallback should no other task be measured (a small job used up).
            cold = _first_tasks(timed)
            if cold:
                model = fit_costs([_sample(layout, ranges, r) for r in cold])
            cold_tasks = {r.index for r in cold}
            timed = [] if resumed else [r for r in timed if r.index not in cold_tasks]
            handover = _handover(got)
        first_round, round_ = False, []
        if not timed:
            if resumed and any(r.complete for r in got):
                continue  # the interrupted run's probes warmed the workers: measure now
            break  # nothing to measure (failed units, or the cluster failing under us)
        samples += [_sample(layout, ranges, r) for r in timed]
        model = fit_costs(samples, overhead, handover)
        rounds += 1
        if _measured(
            samples, model, large, limit, rounds, layout, plan, n_workers, options, min_rounds
        ):
            break
        large = next_large_probe(model.per_unit, _fixed(model), large, limit, g)
    return receipts, _cut(run, plan, model, layout, n_workers, options, start_rest)


def _streamed_first_round(
    run: Launcher,
    plan: Plan,
    round_: list,
    layout: UnitLayout,
    clock: SchedulerCpu,
    n_workers: int,
    options: RunOptions,
    start_rest: bool,
    n_followers: int = 0,
):
    """The first round on many workers (twice :data:`MANY_SAMPLES` probes of each size
    at least), read as it comes: each worker's first task to report is cold, left out;
    once the others hold MANY_SAMPLES of each size and half the large probes have
    reported, the rest is cut and started, to run behind the round's last probes
    rather than after the slowest of them. The round's last ``n_followers`` tasks
    follow the large probes (counted as samples, not as large probes to wait for);
    the scheduler's CPU per task is read from ``clock`` at the cut.
    Returns the round's receipts and the rest's (None without ``start_rest``), or
    False where the round ended before it was measured (the caller reads it whole)."""
    ranges = {t.index: (t.start, t.stop) for t in round_}
    smallest = min(t.stop - t.start for t in round_)
    probes = round_[: len(round_) - n_followers]  # (the followers last)
    larges = {t.index for t in probes if t.stop - t.start > smallest}
    got: list[TaskReceipt] = []
    samples: list[ProbeSample] = []
    warm: set[tuple[str, int, str]] = set()  # workers (_worker) heard from
    larges_done, rest = 0, False
    for r in _launched(run, round_, clock):
        got.append(r)
        larges_done += r.index in larges
        worker = _worker(r)
        cold = worker not in warm
        warm.add(worker)
        if rest is not False or cold or not (r.complete and r.units):
            continue
        samples.append(_sample(layout, ranges, r))
        # Half the large probes in: the hand-over is then that of the round's typical
        # worker (the first to report are those that waited least between tasks).
        if _many(samples) and 2 * larges_done >= len(larges):
            overhead = _measured_overhead(clock, SCHEDULER_SECONDS_PER_TASK)
            model = fit_costs(samples, overhead, _handover(got))
            rest = _cut(run, plan, model, layout, n_workers, options, start_rest)
    return got, rest


def _sample(layout: UnitLayout, ranges: dict, r: TaskReceipt) -> ProbeSample:
    return ProbeSample(layout.weight(*ranges[r.index]), r.seconds, r.read_seconds, r.bytes_read)


def _fixed(model: CostModel) -> float:
    return model.fixed - model.read_fixed


def _measured(
    samples, model, large, limit, rounds, layout, plan, n_workers, options, min_rounds=2
) -> bool:
    """Whether the probes have measured enough to cut the rest.

    Measured, not modelled: the largest probe's time beyond reading lasts
    PROBE_SECONDS and twice the fixed part beyond reading, so its per-unit part
    outweighs that; and ``min_rounds`` rounds at least (two for a run, since two
    points fit any line; an estimate, whose probes' work is thrown away, may stop
    after one). (The
    reads are measured apart, their fixed part with them.) Or the rest is cut into
    as many tasks whatever a closer slope would be. Or the round held
    :data:`MANY_SAMPLES` probes of each of two sizes, as a round does on hundreds of
    workers: their many points fit the line however noisy each is, where another
    round would cost every worker another probe and another wait for the slowest."""
    if large >= limit or _many(samples):
        return True
    if rounds < min_rounds:
        return False
    biggest = max(samples, key=lambda p: p.units)
    work = biggest.seconds - biggest.read_seconds
    return work >= max(PROBE_SECONDS, 2 * _fixed(model)) or cut_is_settled(
        layout, sum(plan.head), model, n_workers, options.task_seconds
    )


#: Probes of each of two sizes that fit the cost model in one measured round.
MANY_SAMPLES = 32


def _many(samples) -> bool:
    """Whether ``samples`` hold :data:`MANY_SAMPLES` of each of two sizes."""
    sizes = collections.Counter(s.units for s in samples)
    return sum(1 for n in sizes.values() if n >= MANY_SAMPLES) >= 2


def _cut(run: Launcher, plan: Plan, model, layout, n_workers, options, start_rest: bool):
    """Cut the units after the probes by ``model``, record the plan and, with
    ``start_rest``, start the tasks after the probes, longest first: their receipts
    as they come (else None). Started, the last round is tapered (not for an
    estimate, which samples the full-size tasks)."""
    workload, n = run.workload, run.workload.n_units
    start = sum(plan.head)
    measured = _describe_model(model, workload.unit_name)
    if model is None:  # nothing measured: several tasks per worker, to be safe
        plan.stops = cut_tasks(
            layout, start, CostModel(0.0, 1.0), n_workers, 1.0, rounds=MIN_TASKS_PER_WORKER
        )
    else:
        stops = cut_tasks(layout, start, model, n_workers, options.task_seconds)
        plan.stops = tapered(layout, start, stops, model, n_workers) if start_rest else stops
        plan.model = {k: float(f"{v:.4g}") for k, v in asdict(model).items()}
    rest = longest_first(layout, plan.tasks[len(plan.head) :]) if start_rest else None
    save_plan(workload, run.store, plan)
    log.info(
        "%d probe tasks: %s; the other %d %ss in %d tasks (typically %d)",
        len(plan.head),
        measured,
        n - start,
        workload.unit_name,
        len(plan.stops),
        plan.typical_size,
    )
    return None if rest is None else run.launch(rest)


def _worker(r: TaskReceipt) -> tuple[str, int, str]:
    """The Dask worker that ran ``r``: host, process and address (workers can share a
    process)."""
    return (r.worker, r.pid, r.worker_address)


def _first_tasks(receipts: list[TaskReceipt]) -> list[TaskReceipt]:
    """Each worker's first task to start among ``receipts``."""
    first: dict[tuple[str, int, str], TaskReceipt] = {}
    for r in receipts:
        key = _worker(r)
        if key not in first or r.started < first[key].started:
            first[key] = r
    return list(first.values())


def _handover(receipts: list[TaskReceipt]) -> float:
    """The mean of a worker's idle seconds between one of ``receipts`` and its
    next, over the workers that ran several (a round submitted at once, so each
    worker's next task was waiting for it); 0.0 where none did. The mean: what a task
    costs its worker on average (the first to report are the workers that waited
    least, and a median of them said 0.11 s where the round's was 0.40)."""
    runs: dict[tuple[str, int, str], list[TaskReceipt]] = collections.defaultdict(list)
    for r in receipts:
        if r.started and r.worker_address:
            runs[_worker(r)].append(r)
    gaps = []
    for ran in runs.values():
        ran.sort(key=lambda r: r.started)
        gaps += [max(0.0, b.started - a.started - a.seconds) for a, b in itertools.pairwise(ran)]
    return statistics.fmean(gaps) if gaps else 0.0


def _launched(run: Launcher, tasks: list, clock: SchedulerCpu):
    """``run.launch(tasks)``, the scheduler's CPU read as their receipts come."""
    clock.submitted(len(tasks))
    for r in run.launch(tasks):
        clock.reported()
        yield r


def _gathered(run: Launcher, tasks: list, clock: SchedulerCpu) -> list[TaskReceipt]:
    return list(_launched(run, tasks, clock))


def _measured_overhead(clock: SchedulerCpu, assumed: float) -> float:
    """The scheduler's CPU per task over the readings so far, else ``assumed``; no
    readings after this one."""
    measured = clock.per_task()
    clock.enabled = False
    if measured is None:
        return assumed
    log.info(
        "scheduling: %.3g ms of the scheduler's CPU per task (read while %d probes ran)",
        measured * 1e3,
        round(clock.tasks),
    )
    return measured


def _describe_model(model: CostModel | None, unit: str) -> str:
    if model is None:
        return "nothing measured"
    return (
        f"a task takes {model.fixed:.3g} s + {model.per_unit:.3g} s per {unit}"
        + (f" + {model.per_byte * 1e9:.3g} s per GB read" if model.per_byte else "")
        + f", {model.handover:.3g} s between tasks"
        + f", and {model.overhead * 1e3:.3g} ms of scheduling"
    )
