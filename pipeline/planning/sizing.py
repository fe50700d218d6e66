"""Task sizes from a cost model, with task boundaries on the data's own boundaries.

A task's time is ``fixed + per_unit * units + per_byte * bytes_read``. The fixed
part is what every task pays whatever its size (starting, opening its inputs,
writing its tables); the byte part is what it reads, which for a task smaller
than a row group is the whole row group. Between one task and its next a worker
also waits a ``handover`` (the finished task's report, the next one's hand-over).
The probe tasks measure all four (:func:`fit_costs`), and the scheduler's own cost
per task (``overhead``).

:func:`cut_tasks` then aims every task at a duration of

    target = max(task_seconds, overhead * workers / SCHEDULER_SHARE,
                 (fixed + handover) / PER_TASK_SHARE)

so that (a) tasks last about ``task_seconds``; (b) at the task rate this gives,
``workers / target`` tasks a second, the scheduler spends at most
``SCHEDULER_SHARE`` (25 %) of one core on them: at 1 ms a task, 2 workers need
tasks of 8 ms, 1,000 workers tasks of 4 s; (c) what every task costs whatever its
size is at most ``PER_TASK_SHARE`` (a tenth) of a worker's time. A job too small
to give each worker :data:`MIN_TASKS_PER_WORKER` such tasks is cut into up to that
many rounds of shorter tasks (at least :data:`SHORT_TASK_SECONDS` and 4x the
per-task costs; one round when a worker's share
is under that), rounds of exactly ``workers`` tasks.

The cuts fall on the workload's *natural boundaries* (row groups and files for
a dataset, shards for cubes), so each row group is read by one task, unless
cutting inside a group finishes the job sooner (a job of one row group and two
workers): both plans are costed with the model and the aligned one is kept
unless it is clearly slower.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..workload import Workload

#: The most of one scheduler core the job's tasks may take, at the planned task rate.
SCHEDULER_SHARE = 0.25
#: The most of a worker's time its tasks' own costs (fixed part, hand-over) may take:
#: 0.9 of it at least goes to the units. (At a fifth, a fleet whose workers waited 1 s
#: between tasks lost a sixth of the run's tasks' time to the waits, whatever else
#: went well: no run could reach 0.8 of the ideal.)
PER_TASK_SHARE = 0.1
#: Enough tasks per worker that uneven tasks do not leave workers idle at the end.
MIN_TASKS_PER_WORKER = 4
#: A small job's tasks last at least this (and 4x their fixed cost): shorter ones cost
#: more in fixed costs than they save, longer ones leave workers idle at the end when
#: one runs slower than the other (on a busy machine a task's time varies by half).
SHORT_TASK_SECONDS = 0.1
#: An aligned plan is kept unless the unaligned one finishes this much sooner.
ALIGNED_SLACK = 1.10
#: Dask's scheduler spends about a millisecond per task (Dask's own guidance): the
#: overhead assumed where it is not measured.
SCHEDULER_SECONDS_PER_TASK = 1e-3
#: Above any per-task scheduling cost seen (1-3 ms on a quiet cluster, 5-15 ms on a
#: loaded 2-core VM): on clusters so small that even this could not lengthen tasks,
#: the overhead is not measured (see :func:`overhead_can_bind`).
OVERHEAD_BOUND = 0.025


@dataclass(frozen=True)
class CostModel:
    """Seconds a task takes: ``fixed + per_unit * units + per_byte * bytes_read``."""

    fixed: float
    per_unit: float
    per_byte: float = 0.0
    #: The scheduler's seconds (of its CPU) per task.
    overhead: float = 0.0
    #: Of ``fixed``, what a task's reads pay whatever their size (a request's latency).
    read_fixed: float = 0.0
    #: A worker's idle seconds between one task and its next: the finished task's
    #: report, the next one's hand-over (a round trip, the worker's own event loop).
    handover: float = 0.0

    def seconds(self, units: float, bytes_read: float = 0.0) -> float:
        return self.fixed + self.per_unit * units + self.per_byte * bytes_read

    @property
    def fixed_beyond_reads(self) -> float:
        return self.fixed - self.read_fixed

    def describe(self, unit: str) -> str:
        return (
            f"a task takes {self.fixed:.3g} s + {self.per_unit:.3g} s per {unit}"
            + (f" + {self.per_byte * 1e9:.3g} s per GB read" if self.per_byte else "")
            + f", {self.handover:.3g} s between tasks"
            + f", and {self.overhead * 1e3:.3g} ms of scheduling"
        )


@dataclass(frozen=True)
class ProbeSample:
    units: float  # weighted units (see UnitLayout.weight)
    seconds: float
    read_seconds: float = 0.0
    bytes_read: int = 0


def fit_costs(
    samples: list[ProbeSample], overhead: float = 0.0, handover: float = 0.0
) -> CostModel:
    """Least squares of (seconds - read_seconds) on units, and of read_seconds on
    bytes read: a read's own fixed part (a request's latency; on S3 a task makes one
    or more) joins the task's fixed part.

    Needs samples of sizes far apart (the probes pair 1-unit tasks with large ones);
    with one size only, the time is taken as all per unit (no fixed part).
    """
    per_byte, read_fixed = _fit_reads(samples)

    def model(fixed_beyond_reads: float, per_unit: float) -> CostModel:
        return CostModel(
            fixed_beyond_reads + read_fixed, per_unit, per_byte, overhead, read_fixed, handover
        )

    x = np.array([s.units for s in samples], dtype=float)
    y = np.array([s.seconds - s.read_seconds for s in samples], dtype=float)
    y = np.maximum(y, 0.0)
    if len(samples) >= 2 and np.ptp(x) > 0:
        slope, intercept = np.polyfit(x, y, 1)
        if slope > 0 and intercept >= 0:
            return model(float(intercept), float(slope))
        if slope <= 0:
            # Time did not grow with size: all fixed, units nearly free.
            return model(float(np.median(y)), 1e-9)
    return model(0.0, max(float(y.sum() / max(x.sum(), 1e-9)), 1e-9))


def _fit_reads(samples: list[ProbeSample]) -> tuple[float, float]:
    """(per_byte, fixed seconds per task) of the samples' reads: a line through them
    where their sizes differ and it has a positive slope and intercept, else all
    per byte."""
    b = np.array([s.bytes_read for s in samples], dtype=float)
    t = np.array([s.read_seconds for s in samples], dtype=float)
    if not b.sum():
        return 0.0, 0.0
    if len(samples) >= 2 and np.ptp(b) > 0:
        slope, intercept = np.polyfit(b, t, 1)
        if slope > 0 and intercept > 0:
            return float(slope), float(intercept)
    return float(t.sum() / b.sum()), 0.0


@dataclass
class UnitLayout:
    """What the planner knows of a job's units besides their count."""

    n: int
    #: Sorted unit indices where a task may start without sharing reads with the task
    #: before it, with 0 and n; None: every ``granularity`` units.
    boundaries: np.ndarray | None = None
    granularity: int = 1
    #: Whether a task may also start between boundaries (at a cost: a group read twice).
    splittable: bool = True
    #: Cumulative relative cost of units 0..i-1 (length n+1, ending at n); None: equal.
    cum_weight: np.ndarray | None = None
    #: Bytes a task of units start..stop-1 reads.
    read_bytes: Callable[[int, int], int] | None = None

    def __post_init__(self) -> None:
        b = self.boundaries
        if b is not None:
            self._bw = b.astype(float) if self.cum_weight is None else self.cum_weight[b]

    def weight(self, start: int, stop: int) -> float:
        if self.cum_weight is None:
            return float(stop - start)
        return float(self.cum_weight[stop] - self.cum_weight[start])

    def bytes(self, start: int, stop: int) -> int:
        return self.read_bytes(start, stop) if self.read_bytes else 0

    def unit_at(self, weight: float) -> int:
        """The unit index whose cumulative weight is nearest ``weight``."""
        if self.cum_weight is None:
            return min(self.n, max(0, round(weight)))
        i = int(np.searchsorted(self.cum_weight, weight))
        i = min(self.n, max(1, i))
        nearer_below = abs(self.cum_weight[i - 1] - weight) <= abs(self.cum_weight[i] - weight)
        return i - 1 if nearer_below else i

    def snap(self, after: int, weight: float, reach: float = math.inf) -> int:
        """The boundary past unit ``after`` whose cumulative weight is nearest ``weight``;
        for a splittable layout, the unit there instead when no boundary is within
        ``reach`` of it (chunks that span row groups leave long stretches without a
        boundary: a task there shares a group with the next rather than growing long)."""
        b = self._snap(after, weight)
        if self.splittable and abs(self.weight(0, b) - weight) > reach:
            u = self.unit_at(weight)
            if u > after:
                return u
        return b

    def _snap(self, after: int, weight: float) -> int:
        if self.boundaries is None:
            g, u = self.granularity, self.unit_at(weight)
            first = min(self.n, (after // g + 1) * g)
            near = {min(self.n, max(first, (u // g) * g)), min(self.n, max(first, -(-u // g) * g))}
            return min(sorted(near), key=lambda c: abs(self.weight(0, c) - weight))
        b, bw = self.boundaries, self._bw
        i = int(np.searchsorted(b, after, side="right"))  # the first boundary past it
        j = min(max(int(np.searchsorted(bw, weight)), i), len(b) - 1)
        if j > i and abs(bw[j - 1] - weight) <= abs(bw[j] - weight):
            j -= 1
        return int(b[j])


def make_layout(
    n: int,
    granularity: int = 1,
    boundaries=None,
    weights=None,
    read_bytes: Callable[[int, int], int] | None = None,
) -> UnitLayout:
    """A layout: ``boundaries`` default to every ``granularity`` units; with a
    granularity above 1 tasks never cut between them (whole shards)."""
    b = None
    if boundaries is not None:
        b = np.asarray(boundaries, dtype=np.int64)
        b = np.unique(np.concatenate([b[(b >= 0) & (b <= n)], [0, n]]))
    cum = None
    if weights is not None:
        w = np.asarray(weights, dtype=float)
        if len(w) != n or (w < 0).any():
            raise ValueError(f"unit weights: {len(w)} non-negative values expected, one per unit")
        if w.sum() > 0:
            cum = np.concatenate([[0.0], np.cumsum(w * (n / w.sum()))])
    return UnitLayout(n, b, granularity, granularity == 1, cum, read_bytes)


def overhead_can_bind(n_workers: int, task_seconds: float) -> bool:
    """Whether the scheduler's share could set the target on ``n_workers``: not on a
    few workers, where at ``OVERHEAD_BOUND`` a task they would still take less than
    ``SCHEDULER_SHARE`` of the scheduler's core with tasks of ``task_seconds``."""
    return n_workers * OVERHEAD_BOUND / SCHEDULER_SHARE > task_seconds


def target_seconds(model: CostModel, n_workers: int, task_seconds: float) -> float:
    """How long a task should last (see the module's docstring for the rule)."""
    scheduler_floor = model.overhead * n_workers / SCHEDULER_SHARE
    return max(task_seconds, scheduler_floor, (model.fixed + model.handover) / PER_TASK_SHARE)


def task_rounds(
    layout: UnitLayout, start: int, model: CostModel, n_workers: int, task_seconds: float
) -> tuple[int, bool]:
    """Rounds of ``n_workers`` tasks for units ``start..``, and whether the job is
    small (fewer than :data:`MIN_TASKS_PER_WORKER` targets a worker)."""
    total = layout.weight(start, layout.n)
    per_unit = model.per_unit + model.per_byte * layout.bytes(start, layout.n) / max(total, 1e-12)
    target = target_seconds(model, n_workers, task_seconds)
    units = max(1e-9, (target - model.fixed) / max(per_unit, 1e-12))
    rounds = total / (n_workers * units)
    if rounds >= MIN_TASKS_PER_WORKER:
        return round(rounds), False
    # A small job: as many rounds (up to 4) as tasks of at least `short` allow; one
    # round when a worker's share is under that.
    per_task = model.fixed + model.overhead + model.handover
    short = min(target / 2, max(SHORT_TASK_SECONDS, 4 * per_task))
    share = total * per_unit / n_workers
    return min(MIN_TASKS_PER_WORKER, max(1, math.floor(share / short))), True


def cut_tasks(
    layout: UnitLayout,
    start: int,
    model: CostModel,
    n_workers: int,
    task_seconds: float,
    rounds: int | None = None,
) -> list[int]:
    """The stops of the tasks covering units ``start..n-1`` (ascending, last = n):
    ``rounds`` rounds of ``n_workers`` tasks if given, else as the model says."""
    n = layout.n
    if start >= n:
        return []
    if rounds is None:
        rounds, _small = task_rounds(layout, start, model, n_workers, task_seconds)
    count = rounds * n_workers
    cost = lambda stops: makespan(layout, start, stops, model, n_workers)  # noqa: E731
    best = _aligned(layout, start, count)
    # Groups coarser than the even cuts make uneven tasks: a round more or fewer may
    # fit them better; it must be clearly better, since fewer tasks always save fixed
    # costs and would otherwise win every time.
    others = (count - n_workers, count + n_workers)
    alternatives = [_aligned(layout, start, c) for c in others if c >= 1]
    # Tasks of whole groups, each as near the target as the groups allow.
    alternatives.append(_greedy(layout, start, layout.weight(start, layout.n) / count))
    for alt in alternatives:
        if alt and cost(alt) * ALIGNED_SLACK < cost(best):
            best = alt
    size = layout.weight(start, n) / count
    if layout.splittable and _too_long(layout, start, best, size):
        # Boundaries far apart (chunks spanning row groups): tasks over twice their
        # size, where cutting inside a stretch re-reads one group. Cut there unless
        # that is clearly slower: the model, linear in units, does not see what
        # long tasks cost (a worker idle at the end, tables of millions of rows).
        near = _aligned(layout, start, count, reach=size / 2)
        if cost(near) <= cost(best) * ALIGNED_SLACK:
            best = near
    if layout.splittable:
        even = _even(layout, start, count)
        if cost(even) * ALIGNED_SLACK < cost(best):
            return even
    return best


def _ideal_cuts(layout: UnitLayout, start: int, count: int) -> list[float]:
    base = layout.weight(0, start)
    step = layout.weight(start, layout.n) / count
    return [base + i * step for i in range(1, count)]


def _even(layout: UnitLayout, start: int, count: int) -> list[int]:
    cuts = {layout.unit_at(w) for w in _ideal_cuts(layout, start, count)}
    return [*sorted(c for c in cuts if start < c < layout.n), layout.n]


def _aligned(layout: UnitLayout, start: int, count: int, reach: float = math.inf) -> list[int]:
    """Even cuts moved to the nearest natural boundary (duplicates merged); with
    ``reach``, only to one that near (else cut there, if the layout may be cut)."""
    stops = {layout.snap(start, w, reach) for w in _ideal_cuts(layout, start, count)}
    return sorted(stops | {layout.n})


def _too_long(layout: UnitLayout, start: int, stops: list[int], size: float) -> bool:
    """Whether a task is over twice ``size`` (weighted units)."""
    return any(layout.weight(a, b) > 2 * size for a, b in zip([start, *stops], stops, strict=False))


def _greedy(layout: UnitLayout, start: int, size: float) -> list[int]:
    """From ``start``, each task ends at the boundary nearest ``size`` units on."""
    stops, at = [], start
    while at < layout.n:
        at = layout.snap(at, layout.weight(0, at) + size)
        stops.append(at)
    return stops


def longest_first(layout: UnitLayout, tasks: list) -> list:
    """``tasks`` (with ``start`` and ``stop``) longest first, ties in unit order: the
    last task each worker takes is then among the shortest, so the workers finish
    together (tasks cut on far-apart row-group boundaries differ by half a task)."""
    return sorted(tasks, key=lambda t: -layout.weight(t.start, t.stop))


def makespan(
    layout: UnitLayout, start: int, stops: list[int], model: CostModel, n_workers: int
) -> float:
    """Estimated wall time of the tasks, handed out longest first (as the runner does)
    to the first free worker."""
    free = [0.0] * n_workers
    bounds = [start, *stops]
    costs = [
        model.seconds(layout.weight(a, b), layout.bytes(a, b))
        for a, b in zip(bounds, stops, strict=False)
    ]
    for cost in sorted(costs, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + cost + model.overhead + model.handover)
    # The scheduler handles tasks one after another: a floor of its own.
    return max(max(free), len(stops) * model.overhead)


def unit_layout(workload: Workload) -> UnitLayout:
    """The planner's view of the workload's units: boundaries, weights, bytes read."""
    return make_layout(
        workload.n_units,
        workload.granularity,
        workload.natural_boundaries(),
        workload.unit_weights(),
        workload.read_bytes,
    )
