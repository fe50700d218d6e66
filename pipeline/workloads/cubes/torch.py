"""PyTorch datasets of cubes (the ``pipeline[torch]`` extra).

- :class:`CubeStream`: an ``IterableDataset`` of freshly built cubes. Under
  ``DataLoader(num_workers=N)`` loader worker ``w`` builds cubes ``w, w + N, ...``,
  so the workers share the ids without overlap, and a cube depends only on
  (seed, cube id), never on N. Each worker process builds from the frames'
  layout, memory-mapped from the per-host cache, one cube at a time; or, with
  ``batch_size``, whole batches in place in shared memory (use it with
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

Under ``torch.distributed`` each rank takes a disjoint share of the cubes (or
batches), and its loader workers split that share (:mod:`.sharding`).

Without ``device``, cubes are ``torch.float64`` (or ``float32``) tensors of shape
(d, d, d), axes (frame, row, column), sharing memory with the arrays they were
built in (no copy), laid out as built: Fortran order over those axes, so
``is_contiguous()`` is False; the DataLoader's collate copies them into one batch
tensor anyway.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ...errors import ConfigError
from .delivery.threads import thread_batches
from .feed import to_device
from .gather import device_batches, resolve_device
from .host_memory import HostMemory
from .sharding import distributed_rank, items_in, share
from .torch_shards import CubeShards
from .workload import CubeJob, CubeWorkload, build_cube, ensure_auto_frames

__all__ = ["CubeShards", "CubeStream"]

#: Cubes gathered at a time on a device when the stream yields single cubes.
DEVICE_CHUNK = 16
BUILDS = ("device", "cpu")


class CubeStream(IterableDataset):
    """Cubes ``0 .. job.cubes - 1`` built as they are read; with ``with_ids`` each item
    is ``(cube_id, cube)``. Nothing is written anywhere (except the default frames
    of a job that names none, made once under ``output``).

    ``device`` ('cuda', 'cuda:N', 'cpu' or a ``torch.device``): items are on that
    device, contiguous, axes (cube, frame, row, column). ``build``: ``"device"`` (the
    default without a cluster) gathers them on the device from the frames uploaded
    once; ``"cpu"`` (the default with ``cluster=``) builds them with the CPUs as
    without ``device`` (threads, or the cluster's workers) and copies each batch to
    the device from page-locked memory while the next is built. Either way the bytes
    are those of the CPU builder, and iterate it in the training process
    (``DataLoader(num_workers=0)``, or no DataLoader at all)."""

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
    ):
        if batch_size is not None and (
            not isinstance(batch_size, numbers.Integral)
            or isinstance(batch_size, bool)
            or batch_size < 1
        ):
            raise ValueError(
                f"CubeStream: batch_size={batch_size!r}; expected an integer, at least 1"
            )
        self.cluster = cluster
        self.device = None if device is None else resolve_device(device)
        self.build = _build(build, self.device, cluster not in (None, False))
        frames = job.frames or ensure_auto_frames(output, job.dim, job.seed)
        self.workload = CubeWorkload(job, job.name or "cubes", frames)
        self.workload.writes_output = False
        self.workload.preflight()  # bad frames fail here, before any loader starts
        self.with_ids = with_ids
        self.batch_size = batch_size

    def __getstate__(self) -> dict:
        # Sent to loader workers from the training process: with the rank it has, which
        # a spawned worker could not see (no process group there, maybe no RANK).
        return {**self.__dict__, "_rank": distributed_rank()}

    def _share(self, worker) -> tuple[int, int]:
        return share(worker, self.__dict__.get("_rank") if worker else None)

    def __len__(self) -> int:
        """Items (cubes, or batches with ``batch_size``) this process iterates: all of
        them, or its rank's share under ``torch.distributed``."""
        n, b = self.workload.n_units, self.batch_size
        return items_in(distributed_rank(), n if b is None else -(-n // b))

    def __iter__(self):
        info = get_worker_info()
        worker = None if info is None else (info.id, info.num_workers)
        if self.device is not None:
            if worker is not None and self.device.type == "cuda":
                raise RuntimeError(
                    f"CubeStream(device={str(self.device)!r}): a DataLoader worker cannot "
                    "put tensors on a GPU; iterate it in the training process "
                    "(DataLoader(num_workers=0)), or move a loader's CPU batches with "
                    "pipeline.torch.to_device(DataLoader(CubeStream(job, batch_size=b), "
                    "batch_size=None, num_workers=N), 'cuda')"
                )
            if self.build == "device":
                yield from self._device_built(worker)
                return
            if worker is None:
                memory = HostMemory(self.device)
                yield from to_device(self._built(None, memory), self.device, memory=memory)
                return
        for item in self._built(worker):
            if self.device is not None:  # 'cpu' in a loader worker: contiguous here
                item = (*item[:-1], item[-1].contiguous()) if self.with_ids else item.contiguous()
            yield item

    def _built(self, worker, memory=None):
        """The items, built by the CPUs: this process's (or loader worker's) share."""
        if self.cluster is not None and self.cluster is not False:
            if worker is not None:
                raise RuntimeError(
                    "CubeStream(cluster=...): the cluster's workers build the cubes; "
                    "use it with DataLoader(num_workers=0)"
                )
            yield from self._from_cluster(memory)
            return
        if worker is None:  # DataLoader(num_workers=0): threads of this process build
            batches = thread_batches(
                self.workload, self.batch_size or 1, shard=self._share(None), memory=memory
            )
            yield from self._handed_over(batches)
            return
        n, b = self.workload.n_units, self.batch_size
        first, step = self._share(worker)
        if b is None:
            yield from self._cubes(range(first, n, step))
            return
        # Whole batches in turn, not cubes: batches of each worker's cubes ended in a
        # short batch per worker (50 cubes in 8s on 2 workers: 6 of 8, 2 of 1), and
        # more batches than len() said
        for j in range(first, -(-n // b), step):
            yield self._batch(range(j * b, min(n, (j + 1) * b)))

    def _device_built(self, worker):
        """Items gathered on the device: this process's (or loader worker's) share."""
        n, b = self.workload.n_units, self.batch_size
        first, step = self._share(worker)
        if b is None:
            ids = range(first, n, step)
            plan = (ids[i : i + DEVICE_CHUNK] for i in range(0, len(ids), DEVICE_CHUNK))
        else:
            plan = (range(j * b, min(n, (j + 1) * b)) for j in range(first, -(-n // b), step))
        batches = device_batches(self.workload, self.device, plan, b or DEVICE_CHUNK)
        for ids, batch in batches:
            if b is not None:
                yield (torch.tensor(list(ids)), batch) if self.with_ids else batch
                continue
            for cube_id, cube in zip(ids, batch, strict=True):
                yield (cube_id, cube) if self.with_ids else cube
            del cube, batch  # (a cube held past the next item holds its batch)

    def _from_cluster(self, memory=None):
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
            shard=self._share(None),
            memory=memory,
        )
        yield from self._handed_over(batches)

    def _handed_over(self, batches):
        """Items from ``(ids, batch)`` pairs, ``batch`` (d, d, d, n) Fortran-ordered, as
        tensors that share its memory."""
        for ids, batch in batches:
            cubes = torch.from_numpy(batch).permute(3, 0, 1, 2)  # (cube, frame, row, column)
            if self.batch_size is not None:
                yield (torch.tensor(list(ids)), cubes) if self.with_ids else cubes
                continue
            for cube_id, cube in zip(ids, cubes, strict=True):
                yield (cube_id, cube) if self.with_ids else cube

    def _cubes(self, ids: range):
        workload = self.workload
        layout = workload._layout()
        d, dtype = workload.job.dim, workload.job.dtype
        for cube_id in ids:
            # A fresh array per cube: the loader may still hold the previous one.
            out = np.empty((d, d, d), dtype=dtype)
            build_cube(layout, workload.columns(cube_id), out)
            cube = torch.from_numpy(out.T)  # axes (frame, row, column)
            yield (cube_id, cube) if self.with_ids else cube

    def _batch(self, ids: range):
        """Cubes ``ids`` built in place in one (n, d, d, d) tensor in shared memory (as
        the DataLoader's collate would put it), so reaching the training loop from a
        loader worker costs no copy: collating cubes instead copies each one again,
        transposing it."""
        workload = self.workload
        layout = workload._layout()
        d, dtype = workload.job.dim, getattr(torch, workload.job.dtype)
        shape = (len(ids), d, d, d)
        storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
        base = torch.empty(0, dtype=dtype).set_(storage).view(shape)
        out = base.numpy()  # (cube, column, row, frame), C order: what build_cube fills
        for i, cube_id in enumerate(ids):
            build_cube(layout, workload.columns(cube_id), out[i])
        batch = base.permute(0, 3, 2, 1)  # axes (cube, frame, row, column)
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
