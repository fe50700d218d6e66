"""The driver's session with the scheduler: how promptly it sends, how long it waits to
reconnect, the keys of a job's tasks, and letting go of the tasks a killed driver left."""

from __future__ import annotations

import threading

from ..cluster.connect import connect_seconds
from ..workload import Workload
from . import lease

__all__ = [
    "INTERRUPTED",
    "job_prefix",
    "reconnect_seconds",
    "release_left_tasks",
    "send_promptly",
]

#: Set by a Ctrl-C (the command line's handler): the runner's wait raises it again.
INTERRUPTED = threading.Event()
#: Seconds between the client's batches of messages to the scheduler (Dask's: 10 ms).
SEND_INTERVAL = 0.001


def send_promptly(client) -> None:
    """Have ``client`` send its messages to the scheduler at most 1 ms apart. Dask's
    client batches them 10 ms apart, and a probe round is submitted just after the
    last round's receipts came: its tasks would wait for the next batch, a delay as
    long as a short probe itself. A reconnected client is back at Dask's interval."""
    stream = getattr(client, "scheduler_comm", None)
    if isinstance(getattr(stream, "interval", None), float):
        stream.interval = min(stream.interval, SEND_INTERVAL)


def job_prefix(workload: Workload, output_url: str | None) -> str:
    """The start of the keys of a job's tasks on the scheduler: the job and its output."""
    import xxhash

    where = f"{output_url or ''}/{workload.job_id}"
    return f"pipeline-{workload.kind}-{xxhash.xxh3_64_hexdigest(where.encode())[:12]}-"


def release_left_tasks(client, workload: Workload, output_url: str) -> None:
    """Before a run of a job that writes its output (it holds the job's lock, so any
    driver that ran it before is gone): the tasks such a driver left held on the
    scheduler start no more (:func:`.lease.release_job`)."""
    lease.ensure_lease(client, reconnect_seconds(client) + 10.0)
    lease.release_job(client, job_prefix(workload, output_url))


def reconnect_seconds(client) -> float:
    """How long the client itself tries to reconnect (its ``timeout``), and a little:
    it says so by closing."""
    timeout = getattr(client, "_timeout", None)
    return (float(timeout) if timeout else connect_seconds()) + 5.0
