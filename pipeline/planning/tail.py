"""The end of a job: its last round of tasks cut into shorter ones, so that the
workers finish together.

Tasks of one size handed out longest first end together only when the workers
start on them together. After the probes they do not: each worker starts on the
rest when its own probes end, seconds apart, and then takes a task whenever it is
free, so the last tasks end as far apart as one task lasts (on 500 simulated
workers, 12 s tasks ended from 77 s to 89 s, the median worker idle for 5 s). So
the units of the last round are cut into tasks of half the size, then a quarter,
and so on (a geometric taper, as guided self-scheduling does), down to
:func:`tail_floor_seconds`: the last tasks each worker takes are then short, and
whichever worker is free first takes the next. The taper adds a task or two per
worker, each paying its hand-over; the floor keeps that cost well under what it
saves.
"""

from __future__ import annotations

from .sizing import SCHEDULER_SHARE, SHORT_TASK_SECONDS, CostModel, UnitLayout

__all__ = ["tail_floor_seconds", "tapered"]

#: Halvings of the last round at most (tasks of an eighth, then an eighth again).
MAX_HALVINGS = 3


def tail_floor_seconds(model: CostModel, n_workers: int) -> float:
    """The shortest task of the taper: twice what a task costs besides its units (its
    fixed part, the hand-over), and at most twice the scheduler's planned task rate."""
    scheduler_floor = model.overhead * n_workers / SCHEDULER_SHARE
    return max(SHORT_TASK_SECONDS, 2 * (model.fixed + model.handover), scheduler_floor / 2)


def tapered(
    layout: UnitLayout, start: int, stops: list[int], model: CostModel, n_workers: int
) -> list[int]:
    """``stops`` (tasks covering units ``start..n-1`` in rounds of ``n_workers``) with
    the last round's units cut again into ``n_workers`` tasks of half its task size,
    ``n_workers`` of a quarter, ... down to :func:`tail_floor_seconds`, the smallest
    size twice (the sizes sum to the round's). Unchanged where the tasks are one
    round (the workers start on them together) or too short to halve."""
    if len(stops) < 2 * n_workers:
        return stops
    first = stops[-n_workers - 1]  # where the last round starts
    weight = layout.weight(first, layout.n)
    size = weight / n_workers
    per_unit = model.per_unit + model.per_byte * layout.bytes(first, layout.n) / max(weight, 1e-12)
    floor = tail_floor_seconds(model, n_workers)
    sizes: list[float] = []
    # (two units or shards a task at least: halves of fewer would fall together)
    while (
        len(sizes) < MAX_HALVINGS
        and size / 2 >= 2 * layout.granularity
        and model.fixed + per_unit * size / 2 >= floor
    ):
        size /= 2
        sizes.append(size)
    if not sizes:
        return stops
    sizes.append(sizes[-1])
    cuts, at, reached = [], first, layout.weight(0, first)
    for size in sizes:
        for _ in range(n_workers):
            reached += size
            cut = layout.snap(at, reached)
            if at < cut < layout.n:
                cuts.append(cut)
                at = cut
    return [*stops[:-n_workers], *cuts, layout.n]
