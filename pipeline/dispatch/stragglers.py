"""When a task runs again beside itself, and the bounds on it.

**Backups of slow tasks.** A fleet always has a slow node (a noisy neighbour, a
throttled disk), and its tasks set the run's end. So once :data:`BACKUP_AFTER_DONE` of
a run's tasks have reported, a task its worker has been executing for
:data:`BACKUP_MULTIPLE` times the run's median task time (and at least
:data:`BACKUP_MIN_SECONDS`), or one waiting on that worker behind such a task, gets
one backup copy on another worker, ahead of the tasks queued there. Whichever copy
reports first gives the task's receipt; the other runs to its end ignored (a Dask
task's thread cannot be stopped, and while the scheduler still counts it, the slow
worker is not handed more tasks to queue behind it). The rule is Spark's
speculation (3 times the median, its 4.0 defaults, once 90 % of the tasks are done)
and Cubed's (3 times, once half are done), from MapReduce's backup tasks.

**Lost tasks.** A scheduler under load can hold a task as running on a worker that
never got it (the message lost on the way), and then nothing ends the wait. So once
a run is down to its last tasks (no more than one per worker thread, none waiting to
be submitted), a task not heard from for :data:`FACTOR` times the run's median task
time (and at least :data:`SECONDS`), that the scheduler holds on a worker that does
not report executing it (a task queued for a free worker is not lost), gets a copy
on another worker; again after as long, up to :data:`MAX_COPIES` copies (a backup
counts as one). When the task's first submission and its copies have all gone that
long unheard, none executing, the run ends with a :class:`~pipeline.errors.ClusterError`
naming the task, its units and the workers the scheduler sent it to: with the
defaults, after at most 3 x max(60 s, 10 x median) of the run's tail without it.

**Bounded.** Copies of both kinds on the cluster at once never exceed
:data:`COPY_SHARE` of its worker threads (at least one): a cluster too loaded to
report is not answered with more load. A copy stops counting once its task
reports, it fails, or it too has gone unheard for as long as a lost task.
"""

from __future__ import annotations

import math
import statistics
import time

from .launch import Launch

__all__ = ["backup_after", "copy_cap", "in_tail", "lost_after", "median", "record"]

#: Share of a run's tasks reported before slow tasks get backups.
BACKUP_AFTER_DONE = 0.5
#: A task executing this many times the run's median task time is slow ...
BACKUP_MULTIPLE = 3.0
#: ... and at least this many seconds (a copy of a task shorter than a few
#: heartbeats gains nothing).
BACKUP_MIN_SECONDS = 1.0
#: The least time a run's last task may go unheard from before it is copied ...
SECONDS = 60.0
#: ... and as many times the run's median task time.
FACTOR = 10.0
#: Copies of one task at most (backups and copies of lost tasks together).
MAX_COPIES = 2
#: Copies on the cluster at once, as a share of its worker threads (at least one).
COPY_SHARE = 0.10
#: Dask priority of a copy: ahead of the tasks queued where it goes.
COPY_PRIORITY = 100
#: Task times kept per run for its median (the latest).
KEPT = 1000


def record(run: Launch, seconds: float) -> None:
    """A task time of ``run`` (from a receipt) for its median."""
    if seconds:
        run.times.append(seconds)
        del run.times[:-KEPT]


def median(run: Launch) -> float:
    return statistics.median(run.times) if run.times else 0.0


def backup_after(run: Launch) -> float | None:
    """Seconds executing after which a task of ``run`` gets a backup; None while too few
    of its tasks have reported."""
    done = run.size - len(run.pending)
    if not run.times or not run.pending or done < BACKUP_AFTER_DONE * run.size:
        return None
    return max(BACKUP_MIN_SECONDS, BACKUP_MULTIPLE * median(run))


def lost_after(run: Launch) -> float:
    """Seconds unheard from after which a task of ``run``'s tail counts as lost."""
    return max(SECONDS, FACTOR * median(run))


def copy_cap(threads: int) -> int:
    """Copies on a cluster of ``threads`` worker threads at once, at most."""
    return max(1, math.floor(COPY_SHARE * threads))


def in_tail(run: Launch, threads: int) -> bool:
    """Whether ``run`` is down to its last tasks (noting since when)."""
    if run.waiting or not run.pending or len(run.pending) > max(1, threads):
        run.tail_since = None
        return False
    if run.tail_since is None:
        run.tail_since = time.monotonic()
    return True
