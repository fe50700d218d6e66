"""A run's workload on the workers: inside each task while that is small, else sent
once to every worker (and to those that join later) by a worker plug-in, each task
carrying only its name.

Not a copy held by one worker (``client.scatter``): every other worker then fetched
it from that one, and at 1,000 simulated workers those fetches swamped its
connections and the run stalled. Not a task dependency either: tasks submitted again
after the driver's connection came back must be the same tasks.
"""

from __future__ import annotations

import contextlib
from typing import Any

import cloudpickle
import xxhash
from distributed.diagnostics.plugin import WorkerPlugin

from ..errors import ClusterError
from . import lease

__all__ = ["INLINE_BYTES", "Shipped", "WorkloadArg", "resolve", "ship", "unship"]

#: Bytes of workload the tasks of one submission may carry inside them in all (the
#: scheduler holds each task's copy until it runs); beyond, it is shipped once.
INLINE_BYTES = 128 * 1024 * 1024

#: The workloads shipped to this worker process, by name.
_SHIPPED: dict[str, Any] = {}


class Shipped:
    """What a task carries in place of a shipped workload: its name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self):
        return (Shipped, (self.name,))


class WorkloadPlugin(WorkerPlugin):
    """Worker plug-in holding one workload's pickle; unpickled once on each worker."""

    def __init__(self, name: str, data: bytes):
        self.name = name
        self.data = data

    def setup(self, worker) -> None:
        _SHIPPED[self.name] = cloudpickle.loads(self.data)

    def teardown(self, worker) -> None:
        _SHIPPED.pop(self.name, None)


def pickled_size(workload) -> tuple[int, bytes]:
    data = cloudpickle.dumps(workload)
    return len(data), data


def ship(client, data: bytes) -> Shipped:
    """Send a workload's pickle to every worker, now and as they join, until this driver
    frees them of it (:func:`unship`) or its lease expires (a killed driver's).

    Named for the driver too: another driver running the same workload frees the
    workers of its own copy only."""
    name = f"pipeline-workload-{xxhash.xxh3_64_hexdigest(data)}-{client.id}"
    client.register_plugin(WorkloadPlugin(name, data), name=name)
    lease.own_plugin(client, name)
    return Shipped(name)


def unship(client, shipped: Shipped) -> None:
    """Free the workers of a shipped workload (nothing when the cluster is gone)."""
    with contextlib.suppress(Exception):
        client.unregister_worker_plugin(shipped.name)


def resolve(workload):
    """Worker: the workload itself, for a task that carries its name."""
    if not isinstance(workload, Shipped):
        return workload
    try:
        return _SHIPPED[workload.name]
    except KeyError:
        raise ClusterError(
            f"this worker has no copy of the run's workload {workload.name}: it joined "
            "while the run's plug-ins were being removed, or the scheduler restarted"
        ) from None


class WorkloadArg:
    """What a run's tasks carry as their workload: the object itself, unless a
    submission's copies of it would pass :data:`INLINE_BYTES`; then it is shipped once
    (and freed from the workers by :meth:`close`), the tasks carrying its name."""

    def __init__(self, client, workload):
        self.client, self.workload = client, workload
        self._pickle: tuple[int, bytes] | None = None
        self.shipped: Shipped | None = None

    def for_tasks(self, count: int):
        if self.shipped is not None:
            return self.shipped
        if self._pickle is None:
            self._pickle = pickled_size(self.workload)
        size, data = self._pickle
        if size * count <= INLINE_BYTES:
            return self.workload
        self.shipped = ship(self.client, data)
        return self.shipped

    def close(self) -> None:
        if self.shipped is not None:
            unship(self.client, self.shipped)
            self.shipped = None
