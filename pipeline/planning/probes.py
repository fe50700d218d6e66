"""The probes: a job's first tasks, run in rounds to measure its cost model, then
the rest of the job cut into tasks by it (see docs/planning.md)."""

from __future__ import annotations

import collections
import itertools
import logging
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
    first_round,
    is_small_job,
    next_large_probe,
    probe_limit,
    probe_round,
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

__all__ = ["ProbeRounds", "probe"]

log = logging.getLogger(__name__)


#: Probes of each of two sizes that fit the cost model in one measured round.
MANY_SAMPLES = 32


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
    """Run probe tasks until they measure the cost model, then cut the rest of ``plan``
    (:class:`ProbeRounds`); a small job's plan is cut unprobed.

    ``layout``: the workload's :func:`unit_layout`, if the caller has it already.
    ``min_rounds``: measured rounds before the probes may stop (an estimate, whose
    probes' work is not kept, takes one when it measured enough).
    Returns the probes' receipts, and with ``start_rest`` the rest's tasks started,
    their receipts as they come (None when the caller is to start them: a small
    job's, or all without ``start_rest``).
    """
    layout = layout or unit_layout(run.workload)
    if not plan.head and is_small_job(run.workload.n_units, n_workers):
        _unprobed(run, plan, layout, n_workers)
        return [], None
    rounds = ProbeRounds(run, plan, layout, options, n_workers, start_rest, min_rounds)
    return rounds.measure(done)


def _unprobed(run: Launcher, plan: Plan, layout: UnitLayout, n_workers: int) -> None:
    """A small job's plan: one round of tasks, recorded."""
    workload = run.workload
    plan.stops = cut_tasks(layout, 0, CostModel(0.0, 1.0), n_workers, 1.0, rounds=1)
    save_plan(workload, run.store, plan)
    log.info(
        "small job: %d %ss in %d tasks, unprobed",
        workload.n_units,
        workload.unit_name,
        len(plan.stops),
    )


class ProbeRounds:
    """One plan's probe rounds, and what they have measured: the samples, the cost
    model fitted to them, the rounds measured and the next large probe's size.

    Each round is waited for: its tasks' durations size the next. A worker's first
    task also loads its inputs, so the first round of this run starts with one small
    task per worker, a warm-up left out of the fit (each worker's first task to
    start is), then a large and a small task for every other worker; the later
    rounds give each worker a large task. The scheduler's CPU per task is read while
    the first round runs (:class:`SchedulerCpu`) where it could bind.
    """

    def __init__(
        self,
        run: Launcher,
        plan: Plan,
        layout: UnitLayout,
        options: RunOptions,
        n_workers: int,
        start_rest: bool = True,
        min_rounds: int = 2,
    ):
        self.launcher, self.plan, self.layout = run, plan, layout
        self.options, self.n_workers = options, n_workers
        self.start_rest, self.min_rounds = start_rest, min_rounds
        self.n, self.granularity = run.workload.n_units, run.workload.granularity
        g = self.granularity
        self.limit = max(g, probe_limit(self.n, n_workers, g))
        self.large = min(self.limit, LARGE_PROBE_FACTOR * g)
        self.receipts: list[TaskReceipt] = []
        self.ranges: dict[int, tuple[int, int]] = {}  # each probe's units, by task index
        self.samples: list[ProbeSample] = []
        self.model: CostModel | None = None
        self.rounds = 0  # rounds measured
        self.overhead = SCHEDULER_SECONDS_PER_TASK
        self.handover = 0.0
        # Measured while the first round runs, where it could bind (no tasks of its own).
        self.clock = SchedulerCpu(run.client, overhead_can_bind(n_workers, options.task_seconds))
        self.streamed = False  # the first round read as it comes (_streamed_first_round)
        self.n_followers = 0  # the streamed first round's, after its small probes

    def measure(self, done: set[int]):
        """The rounds, until the model is measured or no probe can measure it, then the
        rest cut: the probes' receipts and the rest's, as :func:`probe` returns them."""
        # Probes an interrupted run recorded but did not finish come first (a warm-up).
        round_ = [t for t in self.plan.tasks if t.index not in done]
        first = True
        while True:
            resumed = bool(round_)
            if not round_:
                if sum(self.plan.head) == self.n:
                    break
                round_ = self._next_round(first)
            self.ranges.update((t.index, (t.start, t.stop)) for t in round_)
            if first and self.streamed:
                got, rest = self._streamed_first_round(round_)
                if rest is not False:
                    return self.receipts + got, rest
            elif not (first or resumed):
                got, rest = self._streamed_round(round_)
                self.receipts += got
                if rest is not False:
                    return self.receipts, rest
                if not _timed(got):
                    break  # nothing to measure (failed units, or the cluster failing under us)
                self._next_large()
                round_ = []
                continue
            else:
                # Waited for whole: each worker's first task is told apart by its start.
                got = list(self._launched(round_))
            self.receipts += got
            timed = self._read_whole(got, first, resumed)
            first, round_ = False, []
            if not timed:
                if resumed and any(r.complete for r in got):
                    continue  # the interrupted run's probes warmed the workers: measure now
                break  # nothing to measure (failed units, or the cluster failing under us)
            self._add(timed)
            self.rounds += 1
            if self._measured():
                break
            self._next_large()
        return self.receipts, self.cut(self.model)

    def _next_round(self, first: bool) -> list:
        """The next round's probes, added to the plan and recorded before they run."""
        at = sum(self.plan.head)
        left, large, n_workers = self.n - at, self.large, self.n_workers
        if first:
            sizes, self.streamed, self.n_followers = first_round(
                left, large, self.granularity, n_workers, self.start_rest, MANY_SAMPLES
            )
        elif not self.rounds:
            # (after an interrupted run's probes) Small probes in the first measured
            # round only: their fixed part stays in the fit, and on S3 every task
            # pays a request or more.
            sizes = probe_round(self.granularity, large, n_workers, left)
        else:
            # A follower of the same size queued behind each large probe: the
            # workers keep working while the probes report and the rest is cut,
            # not idle for that round trip.
            sizes = probe_round(None, large, n_workers, left)
            sizes += probe_round(None, large, n_workers, left - sum(sizes))
            sizes = aligned_probes(self.layout, at, sizes)
        round_ = self.plan.add_probes(sizes)
        save_plan(self.launcher.workload, self.launcher.store, self.plan)
        return round_

    def _streamed_first_round(self, round_: list):
        """The first round on many workers (twice :data:`MANY_SAMPLES` probes of each
        size at least), read as it comes: each worker's first task to report is cold,
        left out; once the others hold MANY_SAMPLES of each size and half the large
        probes have reported, the rest is cut and started, to run behind the round's
        last probes rather than after the slowest of them. The round's last followers
        follow the large probes (counted as samples, not as large probes to wait
        for); the scheduler's CPU per task is read from the clock at the cut.
        Returns the round's receipts and the rest's (None without ``start_rest``), or
        False where the round ended before it was measured (then read whole)."""
        smallest = min(t.stop - t.start for t in round_)
        probes = round_[: len(round_) - self.n_followers]  # (the followers last)
        larges = {t.index for t in probes if t.stop - t.start > smallest}
        got: list[TaskReceipt] = []
        samples: list[ProbeSample] = []
        warm: set[tuple[str, int, str]] = set()  # workers (worker_key) heard from
        larges_done, rest = 0, False
        for r in self._launched(round_):
            got.append(r)
            larges_done += r.index in larges
            worker = r.worker_key
            cold = worker not in warm
            warm.add(worker)
            if rest is not False or cold or not _measures(r):
                continue
            samples.append(self._sample(r))
            # Half the large probes in: the hand-over is then that of the round's typical
            # worker (the first to report are those that waited least between tasks).
            if _many(samples) and 2 * larges_done >= len(larges):
                overhead = self._measured_overhead(SCHEDULER_SECONDS_PER_TASK)
                rest = self.cut(fit_costs(samples, overhead, _handover(got)))
        return got, rest

    def _streamed_round(self, round_: list):
        """A later round, read as it comes: once a probe settles the cut, the rest
        starts at once, on the workers whose probes are done. Returns the round's
        receipts and the rest's, or False where the round did not settle it."""
        got: list[TaskReceipt] = []
        rest, counted = False, False
        for r in self.launcher.launch(round_):
            got.append(r)
            if rest is not False or not _measures(r):
                continue
            self._add([r])
            if not counted:  # the round counts from its first measured probe
                self.rounds, counted = self.rounds + 1, True
            if self._measured():
                rest = self.cut(self.model)
        return got, rest

    def _read_whole(self, got: list[TaskReceipt], first: bool, resumed: bool):
        """A round waited for whole: the scheduler's CPU per task, where read; in the
        first round, the model of the workers' cold tasks (a fallback) and the
        hand-over between tasks. Returns its receipts that measure the model."""
        timed = _timed(got)
        if self.clock.enabled:
            self.overhead = self._measured_overhead(self.overhead)
        if first:
            # Cold, so slower than the rest will be: left out of the fit, and only a
            # fallback should no other task be measured (a small job used up).
            cold = _first_tasks(timed)
            if cold:
                self.model = fit_costs([self._sample(r) for r in cold])
            cold_tasks = {r.index for r in cold}
            timed = [] if resumed else [r for r in timed if r.index not in cold_tasks]
            self.handover = _handover(got)
        return timed

    def _add(self, timed: list[TaskReceipt]) -> None:
        """Receipts that measure the model: their samples in, the model fitted again."""
        self.samples += [self._sample(r) for r in timed]
        self.model = fit_costs(self.samples, self.overhead, self.handover)

    def _sample(self, r: TaskReceipt) -> ProbeSample:
        weight = self.layout.weight(*self.ranges[r.index])
        return ProbeSample(weight, r.seconds, r.read_seconds, r.bytes_read)

    def _measured(self) -> bool:
        """Whether the probes have measured enough to cut the rest.

        Measured, not modelled: the largest probe's time beyond reading lasts
        PROBE_SECONDS and twice the fixed part beyond reading, so its per-unit part
        outweighs that; and ``min_rounds`` rounds at least (two for a run, since two
        points fit any line; an estimate, whose probes' work is thrown away, may stop
        after one). (The reads are measured apart, their fixed part with them.) Or
        the rest is cut into as many tasks whatever a closer slope would be. Or the
        round held :data:`MANY_SAMPLES` probes of each of two sizes, as a round does
        on hundreds of workers: their many points fit the line however noisy each
        is, where another round would cost every worker another probe and another
        wait for the slowest."""
        if self.large >= self.limit or _many(self.samples):
            return True
        if self.rounds < self.min_rounds:
            return False
        biggest = max(self.samples, key=lambda p: p.units)
        work = biggest.seconds - biggest.read_seconds
        return work >= max(PROBE_SECONDS, 2 * self.model.fixed_beyond_reads) or cut_is_settled(
            self.layout, sum(self.plan.head), self.model, self.n_workers, self.options.task_seconds
        )

    def _next_large(self) -> None:
        model = self.model
        self.large = next_large_probe(
            model.per_unit, model.fixed_beyond_reads, self.large, self.limit, self.granularity
        )

    def cut(self, model: CostModel | None):
        """Cut the units after the probes by ``model``, record the plan and, with
        ``start_rest``, start the tasks after the probes, longest first: their receipts
        as they come (else None). Started, the last round is tapered (not for an
        estimate, which samples the full-size tasks)."""
        plan, layout, n_workers = self.plan, self.layout, self.n_workers
        workload = self.launcher.workload
        start = sum(plan.head)
        if model is None:  # nothing measured: several tasks per worker, to be safe
            plan.stops = cut_tasks(
                layout, start, CostModel(0.0, 1.0), n_workers, 1.0, rounds=MIN_TASKS_PER_WORKER
            )
        else:
            stops = cut_tasks(layout, start, model, n_workers, self.options.task_seconds)
            plan.stops = (
                tapered(layout, start, stops, model, n_workers) if self.start_rest else stops
            )
            plan.model = {k: float(f"{v:.4g}") for k, v in asdict(model).items()}
        rest = longest_first(layout, plan.tasks[len(plan.head) :]) if self.start_rest else None
        save_plan(workload, self.launcher.store, plan)
        log.info(
            "%d probe tasks: %s; the other %d %ss in %d tasks (typically %d)",
            len(plan.head),
            model.describe(workload.unit_name) if model else "nothing measured",
            self.n - start,
            workload.unit_name,
            len(plan.stops),
            plan.typical_size,
        )
        return None if rest is None else self.launcher.launch(rest)

    def _launched(self, tasks: list):
        """``launch(tasks)``, the scheduler's CPU read as their receipts come."""
        self.clock.submitted(len(tasks))
        for r in self.launcher.launch(tasks):
            self.clock.reported()
            yield r

    def _measured_overhead(self, assumed: float) -> float:
        """The scheduler's CPU per task over the readings so far, else ``assumed``; no
        readings after this one."""
        measured = self.clock.per_task()
        self.clock.enabled = False
        if measured is None:
            return assumed
        log.info(
            "scheduling: %.3g ms of the scheduler's CPU per task (read while %d probes ran)",
            measured * 1e3,
            round(self.clock.tasks),
        )
        return measured


def _measures(r: TaskReceipt) -> bool:
    """Whether ``r`` measures the model: a complete task with units."""
    return r.complete and bool(r.units)


def _timed(receipts: list[TaskReceipt]) -> list[TaskReceipt]:
    return [r for r in receipts if _measures(r)]


def _many(samples) -> bool:
    """Whether ``samples`` hold :data:`MANY_SAMPLES` of each of two sizes."""
    sizes = collections.Counter(s.units for s in samples)
    return sum(1 for n in sizes.values() if n >= MANY_SAMPLES) >= 2


def _first_tasks(receipts: list[TaskReceipt]) -> list[TaskReceipt]:
    """Each worker's first task to start among ``receipts``."""
    first: dict[tuple[str, int, str], TaskReceipt] = {}
    for r in receipts:
        key = r.worker_key
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
            runs[r.worker_key].append(r)
    gaps = []
    for ran in runs.values():
        ran.sort(key=lambda r: r.started)
        gaps += [max(0.0, b.started - a.started - a.seconds) for a, b in itertools.pairwise(ran)]
    return statistics.fmean(gaps) if gaps else 0.0
