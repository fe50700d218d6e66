"""Cubes delivered to the consumer's process as fast as the workers build them.

:func:`iter_cubes` picks the path:

- **threads** (``delivery="threads"``), when no client is given: threads of the
  consumer's own process build the cubes, no cluster at all (:mod:`.threads`);
- **shared memory** (``delivery="shared-memory"``), when every worker runs on this
  host (the embedded cluster, or workers started on this machine): workers build
  batches in place in shared-memory buffers, the consumer builds parts of them
  while it waits, and it gets numpy views of them, no copy and no Dask transfer
  (:mod:`.local`, :mod:`.producer`, :mod:`.channel`);
- **Dask** (``delivery="dask"``) otherwise: batches are task results, fetched from the
  workers with ``direct_to_workers`` or relayed by the scheduler (:mod:`.remote`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import numpy as np

from ....config import RunOptions, names_in_scope
from ....errors import ClusterError, ConfigError
from ..sharding import Share
from ..workload import CubeJob, CubeWorkload, ensure_auto_frames
from . import channel
from .local import LocalDelivery
from .producer import reachable
from .remote import RelayedThroughSchedulerWarning, remote_batches
from .threads import thread_batches

__all__ = ["RelayedThroughSchedulerWarning", "batch_cubes_for", "iter_cube_batches", "iter_cubes"]

DELIVERIES = ("auto", "threads", "shared-memory", "dask")
#: Target bytes of one batch sent through Dask: large enough that per-batch
#: messages cost nothing next to building it, small enough that a few per worker
#: fit in memory.
BATCH_BYTES = 32 << 20
#: Target bytes of one batch in shared memory: the batches in rotation (three a
#: producer) must fit the CPU's shared cache beside the frames, so the consumer
#: reads cubes while they are still there. On two cores, batches of one 8 MB cube
#: delivered 1,400-1,990 cubes/s, of two 1,200-1,450, of four 1,230-1,430.
LOCAL_BATCH_BYTES = 8 << 20
WAIT_FOR_WORKERS = 60
#: Run settings of a remote cluster, which the embedded one ``iter_cubes`` starts
#: ignores.
_REMOTE = names_in_scope(RunOptions, "remote")


def batch_cubes_for(dim: int, dtype: str, batch_bytes: int = BATCH_BYTES) -> int:
    return max(1, min(256, batch_bytes // (dim**3 * np.dtype(dtype).itemsize)))


def iter_cubes(
    job: CubeJob,
    *,
    client=None,
    cubes_per_task: int | None = None,
    output: str = "results",
    delivery: str = "auto",
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(cube_id, cube)`` pairs as they are built: in completion order from a
    cluster, in id order from threads.

    For feeding a training loop: each cube is a (d, d, d) array with axes (frame,
    row, column), never written anywhere (a job that names no ``frames`` gets the
    default frames, made once under ``output``). With no ``client`` (or
    ``delivery="threads"``), threads of this process build them, one per core but
    the consumer's, and no cluster starts. With a client whose workers are on this
    host, the cubes are views of shared memory the workers (and this process, while
    it waits) built them in. Either
    way a batch's memory is reused once the consumer drops the last view of it, so
    keep a cube past the next iteration only if you mean to hold its memory
    (``cube.copy()`` holds only its own). A bounded number of batches
    (``cubes_per_task`` cubes each; default one cube from threads, about 8 MB in
    shared memory, 32 MB through Dask) is in flight, so memory stays bounded however
    many cubes the job has.

    Into a GPU: :class:`pipeline.torch.CubeStream` with ``device="cuda"`` builds the
    cubes there, or (``build="cpu"``) builds them as here into page-locked memory
    and copies them in, contiguous, off the consumer's thread.
    """
    batches = iter_cube_batches(
        job, client=client, cubes_per_task=cubes_per_task, output=output, delivery=delivery
    )
    for ids, batch in batches:
        for i, cube_id in enumerate(ids):
            yield cube_id, batch[..., i]
        del batch  # its buffer is free once the consumer drops the last cube


def iter_cube_batches(
    job: CubeJob,
    *,
    client=None,
    cubes_per_task: int | None = None,
    output: str = "results",
    delivery: str = "auto",
    shard: tuple[int, int] = (0, 1),
    drop_last: bool = False,
    contiguous: bool = False,
    memory=None,
) -> Iterator[tuple[Sequence[int], np.ndarray]]:
    """:func:`iter_cubes` a batch at a time: ``(cube ids, batch)``, where ``batch`` is a
    (d, d, d, n) Fortran-ordered array and ``batch[..., i]`` is cube ``ids[i]``; with
    ``contiguous``, a C-ordered (n, d, d, d) array (axes cube, frame, row, column: the
    training layout) and ``batch[i]`` cube ``ids[i]``.

    ``shard=(i, k)``: only this consumer's share of k, by cube as PyTorch's
    ``DistributedSampler`` shares them: cubes ``i, i + k, ...`` of the job padded by
    repeating from cube 0 to a multiple of k (or with ``drop_last``, cut to one), so
    every consumer gets as many cubes, in batches of ``cubes_per_task``
    (:mod:`..sharding`). ``memory``: where batch buffers live, for
    :mod:`pipeline.torch`'s copies to a GPU (``memory.empty(shape, dtype)`` makes the
    threads' buffers; ``memory.register(array)`` is told of each shared-memory buffer,
    after ``memory.reserve(count, nbytes, what)`` of those a path starts with)."""
    from ....cluster.connect import connect
    from ....config import env_name, resolve, settings_of

    if delivery not in DELIVERIES:
        raise ConfigError(f"iter_cubes: delivery={delivery!r}; expected one of {DELIVERIES}")
    if cubes_per_task is not None and cubes_per_task < 1:
        raise ConfigError(f"iter_cubes: cubes_per_task={cubes_per_task}; expected at least 1")
    whole = isinstance(shard, tuple) and len(shard) == 2
    whole = whole and all(isinstance(v, int) and not isinstance(v, bool) for v in shard)
    if not (whole and 0 <= shard[0] < shard[1]):
        raise ConfigError(f"iter_cubes: shard={shard!r}; expected (i, k), integers with 0 <= i < k")
    frames = job.frames or ensure_auto_frames(output, job.dim, job.seed)
    workload = CubeWorkload(job, job.name or "cubes", frames)
    workload.writes_output = False
    workload.preflight()
    share = Share(workload.n_units, shard, drop_last)
    if not len(share):  # drop_last, and fewer cubes than consumers
        return
    if delivery == "threads" or (delivery == "auto" and client is None):
        # One cube a batch: it is read while still in the cache it was built in.
        plan = share.in_batches(cubes_per_task or 1)
        yield from thread_batches(workload, plan, memory=memory, contiguous=contiguous)
        return
    with contextlib.ExitStack() as stack:
        embedded = client is None
        if embedded:
            # The run's settings of PIPELINE_* variables (workers...), but always an
            # embedded cluster: an exported PIPELINE_SCHEDULER connected to that one,
            # whose workers on other hosts cannot build in this host's memory (and,
            # resolved with it, outranked an exported PIPELINE_WORKERS)
            remote = {env_name(f) for f in settings_of(RunOptions) if f.name in _REMOTE}
            environ = {k: v for k, v in os.environ.items() if k not in remote}
            client = stack.enter_context(connect(resolve(RunOptions, None, {}, environ)))
        try:  # a remote cluster may still be starting
            client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS)
        except TimeoutError as exc:
            raise ClusterError(
                f"iter_cubes: no worker joined the scheduler within {WAIT_FOR_WORKERS} s"
            ) from exc
        address = channel.new_address()
        listener = stack.enter_context(channel.listen(address))
        if delivery == "auto":
            here = client.run(reachable, address)
            delivery = "shared-memory" if here and all(here.values()) else "dask"
        if delivery == "shared-memory":
            batch = cubes_per_task or batch_cubes_for(job.dim, job.dtype, LOCAL_BATCH_BYTES)
            plan = share.in_batches(min(batch, max(1, len(share))))
            local = LocalDelivery(
                client, workload, plan, listener, address, memory=memory, contiguous=contiguous
            )
            yield from local.batches()
        else:
            listener.close()
            batch = cubes_per_task or batch_cubes_for(job.dim, job.dtype)
            plan = share.in_batches(min(batch, max(1, len(share))))
            yield from remote_batches(
                client, workload, plan, warn=not embedded, contiguous=contiguous
            )
