"""A cluster's workers as a run sees them: a first one waited for, and a run ended on
a cluster left without any (every worker gone, none restarted: the driver waited,
silent, for ever)."""

from __future__ import annotations

import logging
import time

from ..cluster.connect import worker_threads
from ..errors import ClusterError

__all__ = ["WORKERLESS_SECONDS", "Workerless", "first_workers"]

log = logging.getLogger(__name__)

#: Seconds a run waits, with tasks left, on a cluster that has no worker.
WORKERLESS_SECONDS = 60


def first_workers(client, seconds: float = WORKERLESS_SECONDS) -> int:
    """The cluster's worker threads, once it has one. A scheduler without workers (none
    started yet, or all gone) is an error before any task, not a wait on every task
    and every unit failed with the same advice minutes later."""
    workers = worker_threads(client)
    if workers:
        return workers
    log.warning("no worker on the scheduler yet; waiting up to %d s for one", seconds)
    deadline = time.monotonic() + seconds
    while not workers:
        if time.monotonic() > deadline:
            raise ClusterError(
                f"no worker joined the scheduler at {client.scheduler.address} within "
                f"{seconds} s: start workers against it (docs/remote.md), or check "
                "that they can reach it"
            )
        time.sleep(0.5)
        workers = worker_threads(client)
    return workers


class Workerless:
    """A run's watch over its cluster's workers: none for ``seconds`` ends the run."""

    def __init__(self, client) -> None:
        self.client = client
        self.since: float | None = None

    def wait(self, seconds: float) -> int:
        """The cluster's worker threads, once it has one (raises after ``seconds``)."""
        while not (workers := worker_threads(self.client)):
            self.check(seconds)
            time.sleep(1.0)
        return workers

    def check(self, seconds: float) -> None:
        """Raise once the cluster has had no worker for ``seconds``, mid-run."""
        if self.client.status != "running":
            return
        try:
            workers = worker_threads(self.client)
        except Exception:  # the connection failing between the two: the next look says
            return
        if workers:
            self.since = None
            return
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.warning("the cluster has no worker left; waiting up to %d s for one", seconds)
        elif now - self.since > seconds:
            raise ClusterError(
                f"the cluster at {self.client.scheduler.address} has had no worker for "
                f"{seconds} s, in the middle of the run; every task that completed "
                "is stored: start workers, then run the same command again to resume"
            )
