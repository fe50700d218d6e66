"""A run's copies of its tasks beside their first submission: backups of slow tasks and
copies of lost ones, made, watched and let go of (the rules: :mod:`.stragglers`).

A copy is submitted under a key of its own (``<run>-<index>-c<n>``), restricted to
workers other than those its task was sent to, at a priority ahead of the tasks
queued there, and held for the driver like every task (:mod:`.lease`). The first
receipt of a task, from whichever attempt, is its receipt; its other attempts stay
held while the scheduler has them on a worker, then are let go of: let go of sooner,
one that had started would run on unseen (a Dask task's thread cannot be stopped),
and its worker, free to the scheduler's eyes, would be handed tasks that wait
behind it. Held, it is seen: executing long, it makes its worker slow, and the
tasks queued behind it get backups.

Copies are decided and submitted under the runner's gate, the one its submissions
pass: the receipts that came while the scheduler was surveyed are taken first (a
survey can show a task executing that has reported since: a worker's running tasks
are as of its last heartbeat), so a task whose receipt is in is never copied, and a
runner that has started closing makes none.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ..errors import ClusterError
from . import lease, stragglers
from .launch import Launch
from .survey import Survey, take_survey
from .task import run_task

__all__ = ["Copies", "Copy"]

log = logging.getLogger(__name__)

#: Workers the survey proposes for copies, at most (copies spread over them).
SPARE_WORKERS = 64
#: Scheduler states of an attempt not executing that may be lost: on a worker that
#: does not run it, or with no worker to go to (a copy whose workers left). Queued
#: ones wait their turn.
LOST_STATES = ("processing", "no-worker")


@dataclass
class Copy:
    """One copy of a task on the cluster."""

    key: str
    future: Any
    kind: str  # "backup" (its task was slow) or "copy" (its task was lost)
    since: float  # monotonic: when submitted


class Copies:
    """The copies of the tasks of one runner's runs (keys starting with ``prefix``).
    ``call()`` is what a copy runs with (a task submitted again: a stored entry is its
    receipt); ``unhold(keys)`` lets go of keys held for the driver. ``gate`` is the
    runner's lock on submitting; ``heard()``, called holding it, takes the receipts
    already in and says whether the runner still submits (not closing)."""

    def __init__(
        self,
        client,
        prefix: str,
        call: Callable,
        holder,
        unhold: Callable,
        gate: AbstractContextManager,
        heard: Callable[[], bool],
    ):
        self.client, self.prefix, self._call = client, prefix, call
        self._holder, self._unhold = holder, unhold
        self._gate, self._heard = gate, heard
        #: Attempts of tasks that reported, held while the scheduler has them on a worker.
        self._losers: list[str] = []
        #: The most copies in flight at once so far (logged as it grows).
        self.peak = 0

    # -- the runner's events -------------------------------------------------------------

    def settle(self, run: Launch, index: int, seconds: float, keys: list[str]) -> list[str]:
        """Task ``index`` reported (``seconds`` of work): the keys of its first
        submission (``keys``) to let go of now; with copies, they and the copies' are
        held until no worker executes them."""
        stragglers.record(run, seconds)
        run.tried.pop(index, None)
        extra = run.extra.pop(index, None)
        if not extra:
            return keys
        for copy in extra:
            copy.future.release()
        self._losers.extend(keys + [copy.key for copy in extra])
        return []

    def promote(self, run: Launch, index: int) -> bool:
        """Task ``index``'s first submission failed at the Dask level: a copy of it on
        the cluster takes its place (True), if it has one."""
        extra = run.extra.get(index)
        if not extra:
            return False
        copy = extra.pop(0)
        if not extra:
            del run.extra[index]
        if index in run.keys:
            self._unhold([run.keys[index]])
        run.keys[index], run.futures[index] = copy.key, copy.future
        return True

    def forget(self, run: Launch) -> None:
        """Let go of ``run``'s copies: it ended, or the connection was lost (those still
        needed are made again)."""
        for extra in run.extra.values():
            for copy in extra:
                copy.future.release()
            self._unhold([copy.key for copy in extra])
        run.extra.clear()

    def close(self) -> None:
        self._unhold(self._losers)
        self._losers = []

    # -- looking -------------------------------------------------------------------------

    def check(self, runs: Sequence[Launch], threads: int) -> None:
        """Make the copies the rules call for now; a :class:`ClusterError` when a task's
        attempts are all lost."""
        now = time.monotonic()
        lost = [(run, i) for run in runs for i in self._unheard(run, threads, now)]
        overs = [over for run in runs if (over := stragglers.backup_after(run)) is not None]
        copies = [(run, c) for run in runs for extra in run.extra.values() for c in extra]
        if not (overs or lost or copies or self._losers):
            return
        keys = [c.key for _, c in copies] + self._losers
        keys += [run.keys[i] for run, i in lost if i in run.keys]
        spare = min(SPARE_WORKERS, stragglers.copy_cap(threads) + 8)
        over = min(overs, default=math.inf)
        survey = take_survey(self.client, self.prefix, over, keys, spare)
        seen = survey is not None
        survey = survey or Survey(threads)  # (no survey: no backups, losers let go)
        executing = {k for k, p in survey.placed.items() if p.executing is not None}
        on_worker = {k for k, p in survey.placed.items() if p.state == "processing"}
        self._unhold([k for k in self._losers if k not in on_worker])
        self._losers = [k for k in self._losers if k in on_worker]
        cap = stragglers.copy_cap(survey.threads or threads)
        in_flight = sum(
            1
            for run, c in copies
            if c.key in executing or now - c.since < stragglers.lost_after(run)
        )
        with self._gate:
            if not self._heard():  # (the survey's answer may be older than receipts in)
                return  # closing: no more copies
            in_flight = self._copy_lost(lost, survey, seen, cap, in_flight, now)
            in_flight = self._back_up(runs, survey, cap, in_flight, now)
        if in_flight > self.peak:
            self.peak = in_flight
            log.info("copies in flight: %d, the most so far (bound: %d, %.0f %% of %d worker "
                     "threads)", in_flight, cap, 100 * stragglers.COPY_SHARE,
                     survey.threads or threads)  # fmt: skip

    def _copy_lost(self, lost, survey: Survey, seen: bool, cap: int, in_flight: int,
                   now: float) -> int:  # fmt: skip
        """Copies of the lost tasks (``lost``: (run, index)) not heard from since; the
        copies in flight then."""
        for run, index in lost:
            if index not in run.pending:
                continue  # (its receipt came while the scheduler was surveyed)
            attempts = [run.keys.get(index)] + [c.key for c in run.extra.get(index, [])]
            places = [p for key in attempts if (p := survey.placed.get(key)) is not None]
            run.tried.setdefault(index, set()).update(p.worker for p in places if p.worker)
            if any(p.executing is not None or p.state not in LOST_STATES for p in places):
                continue  # running (slow: a backup's business), or waiting its turn
            if run.copies[index] >= stragglers.MAX_COPIES:
                if seen:  # (on a worker that does not run it, each attempt)
                    raise self._lost(run, index)
                continue
            if in_flight < cap:
                log.warning("task %d not heard from in %.0f s, the run's last: running a copy",
                            index, stragglers.lost_after(run))  # fmt: skip
                self._copy(run, index, "copy", survey, now)
                in_flight += 1
        return in_flight

    def _back_up(self, runs: Sequence[Launch], survey: Survey, cap: int, in_flight: int,
                 now: float) -> int:  # fmt: skip
        """Backups of the slow tasks the survey names, not heard from; the copies in
        flight then."""
        for key, placed in survey.slow.items():
            if in_flight >= cap:
                break
            run, index = self._owner(runs, key)  # (None once its receipt is in)
            over = stragglers.backup_after(run) if run is not None else None
            if over is None or index in run.extra or run.copies[index] >= stragglers.MAX_COPIES:
                continue
            if placed.executing is not None and placed.executing < over:
                continue
            run.tried.setdefault(index, set()).add(placed.worker)
            if self._copy(run, index, "backup", survey, now):
                in_flight += 1
                log.info(
                    "task %d (units %d..%d) %s on %s, the run's median task %.1f s: a backup "
                    "runs on another worker", index, run.pending[index].start,
                    run.pending[index].stop - 1,
                    "waits behind a slow task" if placed.executing is None
                    else f"executing for {placed.executing:.1f} s",
                    placed.worker, stragglers.median(run),
                )  # fmt: skip
        return in_flight

    def _unheard(self, run: Launch, threads: int, now: float) -> list[int]:
        """The tasks of ``run``'s tail unheard from for as long as a lost task (their
        copies' failures dropped first)."""
        for index, extra in list(run.extra.items()):
            for copy in [c for c in extra if c.future.status in ("error", "cancelled")]:
                extra.remove(copy)
                self._unhold([copy.key])
            if not extra:
                del run.extra[index]
        if not stragglers.in_tail(run, threads):
            return []
        limit = stragglers.lost_after(run)
        unheard = []
        for index in run.pending:
            future = run.futures.get(index)
            if future is None or future.status != "pending":
                continue  # (failed, finished without its receipt: the runner's business)
            since = max([run.tail_since] + [c.since for c in run.extra.get(index, [])])
            if now - since >= limit:
                unheard.append(index)
        return unheard

    def _owner(self, runs: Sequence[Launch], key: str) -> tuple[Launch | None, int]:
        try:
            index = int(str(key)[len(self.prefix) :].split("-")[0])
        except ValueError:
            return None, -1
        return next((run for run in runs if index in run.pending), None), index

    def _copy(self, run: Launch, index: int, kind: str, survey: Survey, now: float) -> bool:
        """Submit a copy of task ``index`` on a worker it was not sent to (a backup: none
        such, no copy yet; a lost task's copy: any worker, then)."""
        avoid = run.tried.get(index, set())
        workers = [w for w in survey.spare if w not in avoid]
        if kind == "backup" and not workers:
            return False
        run.copies[index] += 1
        key = f"{self.prefix}{index}-c{run.copies[index]}"
        future = self.client.submit(
            run_task, run.pending[index], self._call(), key=key, pure=False,
            workers=workers or None, allow_other_workers=False,
            priority=stragglers.COPY_PRIORITY,
        )  # fmt: skip
        lease.hold(self.client, self._holder, [key])
        run.extra.setdefault(index, []).append(Copy(key, future, kind, now))
        return True

    def _lost(self, run: Launch, index: int) -> ClusterError:
        task = run.pending[index]
        tried = ", ".join(sorted(run.tried.get(index, ()))) or "none known"
        return ClusterError(
            f"task {index} (units {task.start}..{task.stop - 1}) was lost: neither its "
            f"first submission nor its {run.copies[index]} copies reported, or ran, each "
            f"given {stragglers.lost_after(run):.0f} s (the workers the scheduler sent it "
            f"to: {tried}); the run stops here rather than wait for ever. Every task that "
            "completed is stored: look at those workers' logs, then run the same command "
            "again to resume"
        )
