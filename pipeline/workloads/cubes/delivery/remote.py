"""Delivery from workers on other hosts: batches come back as Dask task results.

Cubes then cross the network, so the network bounds the rate: a c5.24xlarge's
25 Gbps carries about 390 float64 cubes of 100³ per second. With
``direct_to_workers`` the client fetches each batch from the worker that built it;
without it the scheduler relays every batch (worker -> scheduler -> client), which
doubles the traffic through the scheduler's host and occupies the one event loop
that also schedules tasks; a warning says so once per process.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator, Sequence

import numpy as np

from ....cluster.connect import count_workers
from ....errors import ClusterError
from ..workload import CubeWorkload
from .parts import batch_shape, build_part, part_layout

__all__ = ["RelayedThroughSchedulerWarning", "remote_batches"]

#: Batches in flight per worker: one being built, one being sent.
IN_FLIGHT_PER_WORKER = 2

_warned = False


class RelayedThroughSchedulerWarning(UserWarning):
    """Cubes reach the consumer through the scheduler, not from the workers."""


def _warn_relayed(cube_bytes: int) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        "iter_cubes: cubes come as Dask results, and this client fetches results "
        "through the scheduler (direct_to_workers is off): each cube "
        f"({cube_bytes / 1e6:.1f} MB) goes worker -> scheduler -> here, twice the "
        "network traffic, all of it through the scheduler's single event loop, which "
        "also delays scheduling. If this host can reach the workers' addresses, pass "
        "Client(direct_to_workers=True) or --direct-to-workers / "
        "PIPELINE_DIRECT_TO_WORKERS=true. For many epochs over the same cubes, write "
        "them to S3 once (sink = store) and read them with pipeline.torch.CubeShards.",
        RelayedThroughSchedulerWarning,
        stacklevel=4,
    )


def build_batch(
    workload: CubeWorkload, ids: Sequence[int], contiguous: bool = False
) -> tuple[Sequence[int], np.ndarray]:
    """Worker: cubes ``ids`` as one (d, d, d, n) Fortran-ordered array, or with
    ``contiguous`` a C-ordered (n, d, d, d) one."""
    shape = batch_shape(workload.job.dim, len(ids), contiguous)
    batch = np.empty(shape, dtype=workload.job.dtype, order="C" if contiguous else "F")
    if not contiguous:
        workload.build_batch(ids, batch)
        return ids, batch
    layout, whole = part_layout(workload, True), [0, workload.job.dim]  # one part a cube
    for i, cube_id in enumerate(ids):
        build_part(layout, workload.columns(cube_id), batch, whole, i, True)
    return ids, batch


def remote_batches(
    client,
    workload: CubeWorkload,
    plan: Sequence[Sequence[int]],
    *,
    warn=True,
    contiguous: bool = False,
) -> Iterator:
    """Yield ``(cube ids, batch)`` for each batch of cube ids in ``plan``, built as Dask
    tasks, at most ``IN_FLIGHT_PER_WORKER`` per worker in flight, in completion order.
    ``warn``: of results relayed through the scheduler (not for an embedded cluster,
    on this host). ``contiguous``: the batches' layout (:mod:`.parts`)."""
    from distributed import as_completed

    d = workload.job.dim
    if warn and not client.direct_to_workers:
        _warn_relayed(d**3 * np.dtype(workload.job.dtype).itemsize)
    batches = iter(plan)
    n_workers = count_workers(client)

    def submit(ids: Sequence[int]):
        return client.submit(build_batch, workload, ids, contiguous, pure=False)

    first = itertools.islice(batches, IN_FLIGHT_PER_WORKER * n_workers)
    pending = as_completed([submit(ids) for ids in first])
    delivered = 0
    try:
        for future in pending:
            try:
                ids, batch = future.result()
                future.release()
                next_ids = next(batches, None)
                if next_ids is not None:
                    pending.add(submit(next_ids))
            except Exception as exc:
                if not _scheduler_lost(client, exc):
                    raise  # a cube that failed to build: the worker's own error
                n = sum(len(ids) for ids in plan)
                raise ClusterError(
                    f"iter_cubes: lost the connection to the Dask scheduler at "
                    f"{client.scheduler.address} after {delivered:,} of {n:,} cubes (the "
                    f"scheduler or the way to it failed: {type(exc).__name__}); the cubes "
                    "are the same for the same job and seed, so a new iteration gives "
                    "these again"
                ) from None
            delivered += len(ids)
            yield ids, batch
            del batch
    finally:
        pending.clear()


def _scheduler_lost(client, exc: Exception) -> bool:
    """Whether ``exc`` is the client's link to the scheduler failing (the scheduler
    killed, the network down): Dask's own exceptions said that in four tracebacks."""
    from distributed.comm.core import CommClosedError

    return (
        getattr(exc, "reason", None) == "scheduler-connection-lost"
        or isinstance(exc, CommClosedError | ConnectionError)
        or client.status != "running"
    )
