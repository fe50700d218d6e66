"""The last round of tasks cut shorter so that workers starting apart end together."""

from __future__ import annotations

import heapq
from collections import Counter

import numpy as np

from pipeline.planning.sizing import CostModel, cut_tasks, make_layout
from pipeline.planning.tail import tail_floor_seconds, tapered

# 500 workers after the probes: 18,000 units of 1 s left, tasks handed over in 0.65 s.
WORKERS, START = 500, 12_000
MODEL = CostModel(fixed=0.05, per_unit=1.0, overhead=0.004, handover=0.65)


def _sizes(start, stops):
    return [b - a for a, b in zip([start, *stops], stops, strict=False)]


def _ends(start, stops, starts):
    """When each worker ends, tasks handed out longest first to whichever worker is
    free first (workers free at ``starts``)."""
    free = [(t, w) for w, t in enumerate(starts)]
    heapq.heapify(free)
    ends = list(starts)
    for size in sorted(_sizes(start, stops), reverse=True):
        t, w = heapq.heappop(free)
        ends[w] = t + MODEL.seconds(size) + MODEL.handover
        heapq.heappush(free, (ends[w], w))
    return np.array(ends)


def test_the_last_round_is_cut_into_halves_so_workers_starting_apart_end_together():
    layout = make_layout(30_000)
    stops = cut_tasks(layout, START, MODEL, WORKERS, 1.0, rounds=3)
    assert Counter(_sizes(START, stops)) == {12: 1500}  # three rounds of 12 s
    # The scheduler's floor: at most twice the planned 125 tasks a second.
    assert tail_floor_seconds(MODEL, WORKERS) == 0.004 * 500 / 0.25 / 2
    tail = tapered(layout, START, stops, MODEL, WORKERS)
    # Two rounds kept, the third cut into two of 6 (a quarter, 3 s, is under the floor).
    assert tail[: 2 * WORKERS] == stops[: 2 * WORKERS] and tail[-1] == 30_000
    assert _sizes(START, tail)[2 * WORKERS :] == [6] * (2 * WORKERS)
    # Workers that start on the rest up to a task apart (as the probes leave them):
    # the last ends sooner, and the workers wait for it a third less or better.
    starts = np.linspace(0.0, 12.0, WORKERS)
    before, after = _ends(START, stops, starts), _ends(START, tail, starts)
    assert after.max() < before.max() - 1.0, (before.max(), after.max())
    idle = lambda ends: (ends.max() - ends).mean()  # noqa: E731
    assert idle(after) < idle(before) / 1.5, (idle(before), idle(after))


def test_a_single_round_short_tasks_and_whole_shards():
    layout = make_layout(30_000)
    one_round = cut_tasks(layout, START, MODEL, WORKERS, 1.0, rounds=1)
    assert tapered(layout, START, one_round, MODEL, WORKERS) == one_round
    quick = CostModel(fixed=0.01, per_unit=0.01, handover=0.05)  # tasks of 0.1-0.4 s
    short = cut_tasks(layout, START, quick, WORKERS, 0.3, rounds=4)
    assert tapered(layout, START, short, quick, WORKERS) == short
    # Shards of 10 units: the taper's tasks are whole shards, at least two of them.
    shards = make_layout(30_000, granularity=10)
    stops = cut_tasks(shards, START, MODEL, 50, 1.0, rounds=3)
    tail = tapered(shards, START, stops, MODEL, 50)
    assert len(tail) > len(stops) and all(s % 10 == 0 for s in tail)
    assert min(_sizes(START, tail)) >= 20 and tail == sorted(set(tail))
