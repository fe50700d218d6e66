"""The probes' sizes: whether a job is probed at all, each round's sizes, the next
large probe's, and when a more precise cost model would not change the plan. The
probe loop that runs them is :mod:`.probes`; why probes are sized so is in
:mod:`.plan`'s docstring and docs/planning.md."""

from __future__ import annotations

import math
from dataclasses import replace

from .sizing import MIN_TASKS_PER_WORKER, CostModel, UnitLayout, cut_tasks, task_rounds

__all__ = [
    "LARGE_PROBE_FACTOR",
    "PROBE_AIM",
    "PROBE_SECONDS",
    "SMALL_JOB_UNITS_PER_WORKER",
    "aligned_probes",
    "cut_is_settled",
    "is_small_job",
    "next_large_probe",
    "probe_limit",
    "probe_round",
    "round_up",
]

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
