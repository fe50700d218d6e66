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
    "first_round",
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


def first_round(
    left: int, large: int, granularity: int, n_workers: int, start_rest: bool, many: int
) -> tuple[list[int], bool, int]:
    """The first round's sizes, whether it is read as it comes, and its followers (the
    last sizes). A warm-up per worker first (each worker's first task to start), then
    a large probe for every worker and a small one for every other: two sizes to fit a
    line through, and rounds that differ by a small task between workers. (A large
    and a small for only every other worker would leave the others idle through the
    large ones.) Read as it comes where twice ``many`` (samples that fit the model in
    one round) of each size run: half of each may be stuck behind slow probes and the
    other half still measures the model."""
    g = granularity
    warm_ups = [min(g, left)] * min(n_workers, math.ceil(left / g))
    rest = left - sum(warm_ups)
    larges = probe_round(None, large, n_workers, rest)
    smalls = probe_round(None, g, -(-n_workers // 2), rest - sum(larges))
    streamed = large > g and min(len(larges), len(smalls)) >= 2 * many
    followers: list[int] = []
    if streamed:
        # Twice ``many`` small probes are enough to fit (each a task more, whose
        # hand-over costs its worker as much as a large one's); and a follower of half
        # the large size for every worker: the workers keep at the job's units while
        # the round's receipts come back, the rest is cut and its tasks reach them.
        # (Dask hands the followers to whichever worker is free first, so some take
        # two and some none: half a large probe is what that leaves between the
        # workers where they start on the rest.) (No followers where no rest is
        # started: an estimate's.)
        smalls = smalls[: 2 * many]
        if start_rest:
            # No warm-ups where followers come: each worker's large probe is its first
            # task, left out of the fit as a warm-up is, and the smalls and the
            # followers, two sizes run warm, fit the line. (A warm-up a worker cost
            # each a hand-over more, all of them at once: 2-5 s of every worker's time
            # at 500.)
            warm_ups = []
            used = sum(larges) + sum(smalls)
            half = max(g, round_up(large // 2, g))
            followers = probe_round(None, half, n_workers, left - used)
    return warm_ups + larges + smalls + followers, streamed, len(followers)


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
