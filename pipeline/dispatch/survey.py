"""Where a run's tasks are, as the scheduler sees them: which of them a worker is
executing and for how long, which wait on a worker behind a slow one, where each of a
few keys was sent, and the workers with the most room for a copy.

How long a task has been executing comes from its worker's heartbeats (the scheduler's
``WorkerState.executing``, each task's running time at the last heartbeat), plus the
time since that heartbeat: no message per task. The survey is one call to the
scheduler (:func:`take_survey`), its answer a few keys long, whatever the cluster's
size; a scheduler that cannot run it (this package not installed where it runs, or
``distributed.scheduler.pickle`` off) gives None, and the runner does without.
"""

from __future__ import annotations

import heapq
import logging
import time
from dataclasses import dataclass, field

__all__ = ["Placed", "Survey", "survey_scheduler", "take_survey"]

log = logging.getLogger(__name__)

#: Seconds the driver waits for the scheduler's answer before doing without it.
SURVEY_TIMEOUT = 10.0


@dataclass(frozen=True)
class Placed:
    """One key as the scheduler holds it: its state, the worker it was sent to (None
    when none), and how long that worker has been executing it (None when it is not)."""

    state: str
    worker: str | None
    executing: float | None


@dataclass(frozen=True)
class Survey:
    """The scheduler's answer (:func:`survey_scheduler`)."""

    #: The cluster's worker threads.
    threads: int
    #: The run's keys a worker has executed for ``over`` seconds or more, and those
    #: waiting on the same worker behind one (executing None): key -> placement.
    slow: dict[str, Placed] = field(default_factory=dict)
    #: The keys asked about, those the scheduler knows.
    placed: dict[str, Placed] = field(default_factory=dict)
    #: Running workers executing nothing of the run's for ``over`` seconds, least busy
    #: first: where copies go.
    spare: list[str] = field(default_factory=list)


def survey_scheduler(dask_scheduler, prefix: str, over: float, keys: list, spare: int) -> dict:
    """Scheduler: the survey of the tasks whose keys start with ``prefix``, in plain
    types (see :class:`Survey`)."""
    now = time.time()
    slow: dict[str, list] = {}
    slow_workers = set()
    for ws in dask_scheduler.workers.values():
        lag = max(0.0, now - ws.last_seen)
        for ts, seconds in ws.executing.items():
            if str(ts.key).startswith(prefix) and seconds + lag >= over:
                slow[ts.key] = ["processing", ws.address, seconds + lag]
                slow_workers.add(ws)
    for ws in slow_workers:  # the run's tasks waiting behind a slow one
        for ts in ws.processing:
            if str(ts.key).startswith(prefix) and ts.key not in slow and ts not in ws.executing:
                slow[ts.key] = ["processing", ws.address, None]
    placed = {}
    for key in keys:
        ts = dask_scheduler.tasks.get(key)
        if ts is None:
            continue
        ws = ts.processing_on
        seconds = None
        if ws is not None and ts in ws.executing:
            seconds = ws.executing[ts] + max(0.0, now - ws.last_seen)
        placed[key] = [ts.state, ws.address if ws is not None else None, seconds]
    candidates = (
        ws
        for ws in dask_scheduler.workers.values()
        if ws not in slow_workers and str(ws.status.name) == "running"
    )
    roomiest = heapq.nsmallest(
        spare, candidates, key=lambda ws: (len(ws.processing) / max(1, ws.nthreads), ws.occupancy)
    )
    return {
        "threads": int(dask_scheduler.total_nthreads),
        "slow": slow,
        "placed": placed,
        "spare": [ws.address for ws in roomiest],
    }


def take_survey(client, prefix: str, over: float, keys: list, spare: int) -> Survey | None:
    """The scheduler's survey of the run's tasks (keys starting with ``prefix``); None
    when the scheduler cannot run it or does not answer within :data:`SURVEY_TIMEOUT`."""
    if client.status != "running":
        return None
    try:
        raw = client.sync(
            client._run_on_scheduler,
            survey_scheduler,
            prefix=prefix,
            over=over,
            keys=list(keys),
            spare=spare,
            callback_timeout=SURVEY_TIMEOUT,
        )
    except Exception as exc:  # refused, or no answer in time: the runner does without
        if not getattr(client, "_pipeline_survey_failed", False):
            client._pipeline_survey_failed = True
            log.warning(
                "the scheduler cannot say where this run's tasks are (%s: %s): no backup "
                "copies of slow tasks in this run, and copies of lost ones go to any worker",
                type(exc).__name__, exc,
            )  # fmt: skip
        return None

    def places(d: dict) -> dict[str, Placed]:
        return {k: Placed(*v) for k, v in d.items()}

    return Survey(raw["threads"], places(raw["slow"]), places(raw["placed"]), raw["spare"])
