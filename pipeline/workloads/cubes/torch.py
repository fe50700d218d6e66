"""PyTorch datasets of cubes (the ``pipeline[torch]`` extra).

- :class:`CubeStream`: an ``IterableDataset`` of freshly built cubes. Under
  ``DataLoader(num_workers=N)`` loader worker ``w`` builds cubes (or batches) ``w,
  w + N, ...`` of its process's share, so the workers share the ids without
  overlap, and a cube depends only on (seed, cube id), never on N. Each worker
  process builds from the frames' layout, memory-mapped from the per-host cache,
  one cube at a time; or, with ``batch_size``, whole batches in place in shared memory (use it with
  ``DataLoader(batch_size=None)``: the default collate copies every cube again).
  With ``cluster=True`` (the embedded cluster) or ``cluster=client``, the
  cluster's workers build the cubes instead and hand them over through shared
  memory (:func:`pipeline.iter_cube_batches`); use ``DataLoader(num_workers=0)``.
  With ``DataLoader(num_workers=0)`` and no cluster, threads of the training
  process build them, as :func:`pipeline.iter_cubes` does with no client: the
  fastest way on one machine (no process boundary, each cube read from the cache).
- ``device=``: the cubes arrive on that device, contiguous (n, d, d, d): gathered
  there from the frames uploaded once (``build="device"``, :mod:`.gather`), or
  built by the CPUs as above and copied in from page-locked memory off the
  consumer's thread (``build="cpu"``, :mod:`.feed`).
- :class:`CubeShards` (:mod:`.torch_shards`): a map-style ``Dataset`` over a stored
  cube job.

Under ``torch.distributed`` each rank takes its share by cube on every path,
padded (or with ``drop_last`` cut) to the same count on every rank, and its loader
workers split that share (:mod:`.sharding`).

Cubes and batches come in the training layout, C-contiguous with axes ((cube,)
frame, row, column), on the CPU as on a device: the CPU builders write them so
(:func:`.workload.build_cube_frames_first`), sharing memory with the buffers they
were built in (no copy). ``contiguous=False`` keeps the layout cubes are built and
stored in (Fortran order over (frame, row, column)), which costs the builders no
transposition.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ...errors import ConfigError
from .delivery.parts import part_layout
from .delivery.threads import thread_batches
from .feed import to_device
from .gather import device_batches, resolve_device
from .host_memory import HostMemory, pinned_limit
from .sharding import Share, distributed_rank
from .torch_shards import CubeShards
from .workload import (
    CubeJob,
    CubeWorkload,
    build_cube,
    build_cube_frames_first,
    ensure_auto_frames,
)

__all__ = ["CubeShards", "CubeStream"]

#: Cubes gathered at a time on a device when the stream yields single cubes.
DEVICE_CHUNK = 16
BUILDS = ("device", "cpu")


class CubeStream(IterableDataset):
    """Cubes ``0 .. job.cubes - 1`` built as they are read; with ``with_ids`` each item
    is ``(cube_id, cube)``. Nothing is written anywhere (except the default frames
    of a job that names none, made once under ``output``).

    Items are in the training layout: a cube is a C-contiguous (d, d, d) tensor, axes
    (frame, row, column), and a batch (``batch_size``) a C-contiguous (n, d, d, d)
    one, axes (cube, frame, row, column), in the job's dtype (``CubeJob(dtype=...)``,
    float64 by default). ``contiguous=False`` gives the cubes as built instead,
    Fortran-ordered views (what a shard stores), which saves the CPU builders a
    transposition.

    ``device`` ('cuda', 'cuda:N', 'cpu' or a ``torch.device``): items are on that
    device, contiguous. ``build``: ``"device"`` (the default without a cluster)
    gathers them on the device from the frames uploaded once; ``"cpu"`` (the default
    with ``cluster=``) builds them with the CPUs as without ``device`` (threads, or
    the cluster's workers) and copies each batch to the device from page-locked
    memory while the next is built, at most ``pinned_gib`` of it (default
    ``PIPELINE_PINNED_GIB``, else a quarter of the host's RAM: :mod:`.host_memory`).
    Either way the bytes are those of the CPU builder, and iterate it in the
    training process (``DataLoader(num_workers=0)``, or no DataLoader at all).

    Under ``torch.distributed`` each rank takes its share by cube, as
    ``DistributedSampler(shuffle=False)`` does: padded by repeating cubes from the
    start so every rank has ``ceil(n / world)`` cubes, or with ``drop_last=True`` cut
    so every rank has ``floor(n / world)`` (:mod:`.sharding`)."""

    def __init__(
        self,
        job: CubeJob,
        *,
        output: str = "results",
        with_ids: bool = False,
        batch_size: int | None = None,
        cluster=None,
        device=None,
        build: str | None = None,
        drop_last: bool = False,
        contiguous: bool = True,
        pinned_gib: float | None = None,
    ):
        if batch_size is not None and (
            not isinstance(batch_size, numbers.Integral)
            or isinstance(batch_size, bool)
            or batch_size < 1
        ):
            raise ValueError(
                f"CubeStream: batch_size={batch_size!r}; expected an integer, at least 1"
            )
        for name, value in (("drop_last", drop_last), ("contiguous", contiguous)):
            if not isinstance(value, bool):
                raise ValueError(f"CubeStream: {name}={value!r}; expected True or False")
        pinned_limit(pinned_gib)  # a bad limit fails here, not in the loop
        self.cluster = cluster
        self.device = None if device is None else resolve_device(device)
        self.build = _build(build, self.device, cluster not in (None, False))
        frames = job.frames or ensure_auto_frames(output, job.dim, job.seed)
        self.workload = CubeWorkload(job, job.name or "cubes", frames)
        self.workload.writes_output = False
        self.workload.preflight()  # bad frames fail here, before any loader starts
        self.with_ids = with_ids
        self.batch_size = batch_size
        self.drop_last, self.contiguous, self.pinned_gib = drop_last, contiguous, pinned_gib

    def __getstate__(self) -> dict:
        # Sent to loader workers from the training process: with the rank it has, which
        # a spawned worker could not see (no process group there, maybe no RANK).
        return {**self.__dict__, "_rank": distributed_rank()}

    def _share(self, worker) -> Share:
        """This rank's cubes (as the training process saw its rank, in a loader worker)."""
        rank = self.__dict__.get("_rank") if worker else None
        return Share.of_rank(self.workload.n_units, rank, self.drop_last)

    def __len__(self) -> int:
        """Items (cubes, or batches with ``batch_size``) this process iterates: all of
        them, or its rank's share under ``torch.distributed``, padding included."""
        share, b = self._share(None), self.batch_size
        return len(share) if b is None else share.n_batches(b)

    def __iter__(self):
        info = get_worker_info()
        worker = None if info is None else (info.id, info.num_workers)
        share = self._share(worker)
        if self.device is None:
            yield from self._built(worker, share, self.contiguous)
            return
        if worker is not None and self.device.type == "cuda":
            raise RuntimeError(
                f"CubeStream(device={str(self.device)!r}): a DataLoader worker cannot "
                "put tensors on a GPU; iterate it in the training process "
                "(DataLoader(num_workers=0)), or move a loader's CPU batches with "
                "pipeline.torch.to_device(DataLoader(CubeStream(job, batch_size=b), "
                "batch_size=None, num_workers=N), 'cuda')"
            )
        if self.build == "device":
            yield from self._device_built(worker, share)
        elif self.device.type == "cpu":  # built in the training layout: nothing to move
            yield from self._built(worker, share, True)
        else:
            # As built: the GPU transposes while it copies the next batch in
            memory = HostMemory(self.device, self.pinned_gib)
            batches = self._built(None, share, False, memory)
            yield from to_device(batches, self.device, memory=memory)

    def _built(self, worker, share: Share, contiguous: bool, memory=None):
        """The items, built by the CPUs: this process's (or loader worker's) share."""
        if self.cluster is not None and self.cluster is not False:
            if worker is not None:
                raise RuntimeError(
                    "CubeStream(cluster=...): the cluster's workers build the cubes; "
                    "use it with DataLoader(num_workers=0)"
                )
            yield from self._from_cluster(share, contiguous, memory)
            return
        b = self.batch_size
        if worker is None:  # DataLoader(num_workers=0): threads of this process build
            plan = share.in_batches(b or 1)
            batches = thread_batches(self.workload, plan, memory=memory, contiguous=contiguous)
            yield from self._handed_over(batches, contiguous)
            return
        w, workers = worker
        if b is None:
            yield from self._cubes(share.every(w, workers), contiguous)
            return
        # Whole batches in turn, not cubes: batches of each worker's cubes ended in a
        # short batch per worker (50 cubes in 8s on 2 workers: 6 of 8, 2 of 1), and
        # more batches than len() said
        plan = share.in_batches(b)
        for j in range(w, len(plan), workers):
            yield self._batch(plan[j], contiguous)

    def _device_built(self, worker, share: Share):
        """Items gathered on the device: this process's (or loader worker's) share."""
        b = self.batch_size
        if b is None:
            ids = share.every(*worker) if worker else share
            plan = (ids[i : i + DEVICE_CHUNK] for i in range(0, len(ids), DEVICE_CHUNK))
        else:
            in_batches = share.in_batches(b)
            first, step = worker or (0, 1)
            plan = (in_batches[j] for j in range(first, len(in_batches), step))
        for ids, batch in device_batches(self.workload, self.device, plan, b or DEVICE_CHUNK):
            if b is not None:
                yield (torch.tensor(list(ids)), batch) if self.with_ids else batch
                continue
            for cube_id, cube in zip(ids, batch, strict=True):
                yield (cube_id, cube) if self.with_ids else cube
            del cube, batch  # (a cube held past the next item holds its batch)

    def _from_cluster(self, share: Share, contiguous: bool, memory=None):
        """Batches from :func:`pipeline.iter_cube_batches`: built by the cluster's
        workers, on this host in shared memory, and handed over without a copy."""
        from .delivery import iter_cube_batches

        client = None if self.cluster is True else self.cluster
        job = self.workload.job
        batches = iter_cube_batches(
            dataclasses.replace(job, frames=self.workload.frames.url),
            client=client,
            cubes_per_task=self.batch_size,
            delivery="auto" if client else "shared-memory",  # cluster=True: an embedded one
            shard=share.shard,
            drop_last=share.drop_last,
            contiguous=contiguous,
            memory=memory,
        )
        yield from self._handed_over(batches, contiguous)

    def _handed_over(self, batches, contiguous: bool):
        """Items from ``(ids, batch)`` pairs, ``batch`` (n, d, d, d) C-ordered if
        ``contiguous``, else (d, d, d, n) Fortran-ordered, as tensors that share its
        memory."""
        for ids, batch in batches:
            cubes = torch.from_numpy(batch)
            if not contiguous:
                cubes = cubes.permute(3, 0, 1, 2)  # (cube, frame, row, column)
            if self.batch_size is not None:
                yield (torch.tensor(list(ids)), cubes) if self.with_ids else cubes
                continue
            for cube_id, cube in zip(ids, cubes, strict=True):
                yield (cube_id, cube) if self.with_ids else cube

    def _cubes(self, ids, contiguous: bool):
        workload = self.workload
        layout = part_layout(workload, contiguous)
        d, dtype = workload.job.dim, workload.job.dtype
        for cube_id in ids:
            # A fresh array per cube: the loader may still hold the previous one.
            out = np.empty((d, d, d), dtype=dtype)
            if contiguous:  # axes (frame, row, column), C order
                build_cube_frames_first(layout, workload.columns(cube_id), out)
                cube = torch.from_numpy(out)
            else:
                build_cube(layout, workload.columns(cube_id), out)
                cube = torch.from_numpy(out.T)  # axes (frame, row, column)
            yield (cube_id, cube) if self.with_ids else cube

    def _batch(self, ids, contiguous: bool):
        """Cubes ``ids`` built in place in one (n, d, d, d) tensor in shared memory (as
        the DataLoader's collate would put it), so reaching the training loop from a
        loader worker costs no copy: collating cubes instead copies each one again."""
        workload = self.workload
        layout = part_layout(workload, contiguous)
        d, dtype = workload.job.dim, getattr(torch, workload.job.dtype)
        shape = (len(ids), d, d, d)
        storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
        base = torch.empty(0, dtype=dtype).set_(storage).view(shape)
        # (cube, frame, row, column) in C order; as built, (cube, column, row, frame)
        out = base.numpy()
        for i, cube_id in enumerate(ids):
            if contiguous:
                build_cube_frames_first(layout, workload.columns(cube_id), out[i])
            else:
                build_cube(layout, workload.columns(cube_id), out[i])
        batch = base if contiguous else base.permute(0, 3, 2, 1)
        return (torch.tensor(list(ids)), batch) if self.with_ids else batch


def _build(build: str | None, device, cluster: bool) -> str | None:
    """Where a stream's cubes are built: None without a device, else ``build`` (by
    default on the device, or by the cluster's CPUs when it has one)."""
    if build is not None and build not in BUILDS:
        raise ConfigError(f"CubeStream: build={build!r}; expected one of {BUILDS}")
    if device is None:
        if build is not None:
            raise ConfigError(
                f"CubeStream: build={build!r} needs device= (where the cubes go: "
                "'cuda', 'cuda:N' or 'cpu')"
            )
        return None
    if build == "device" and cluster:
        raise ConfigError(
            "CubeStream: cluster= builds the cubes on the cluster's CPUs, and build="
            "'device' on the device: give build='cpu' (copied to the device) or no cluster"
        )
    return build or ("cpu" if cluster else "device")
