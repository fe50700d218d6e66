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
- :class:`CubeShards`: a map-style ``Dataset`` over a stored cube job:
  ``len(ds)`` cubes, ``ds[k]`` is cube k. Local shards are memory-mapped; on S3
  each cube is one ranged GET of its bytes. ``verify=True`` checks every cube read
  against the manifest's checksum.

Cubes are ``torch.float64`` (or ``float32``) tensors of shape (d, d, d), axes
(frame, row, column). They share memory with the arrays they were built in (no
copy), laid out as stored: Fortran order over those axes, so ``is_contiguous()``
is False; the DataLoader's collate copies them into one batch tensor anyway.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from ...errors import InputError, StorageError
from ...layout import consolidated_manifest_key, job_folder, job_record_key, read_job_record
from ...manifest import checksum
from ...results import find_job
from ...storage import open_store, read_parquet
from .delivery.threads import thread_batches
from .shards import npy_header
from .workload import CubeJob, CubeWorkload, build_cube, ensure_auto_frames

__all__ = ["CubeShards", "CubeStream"]


class CubeStream(IterableDataset):
    """Cubes ``0 .. job.cubes - 1`` built as they are read; with ``with_ids`` each item
    is ``(cube_id, cube)``. Nothing is written anywhere (except the default frames
    of a job that names none, made once under ``output``)."""

    def __init__(
        self,
        job: CubeJob,
        *,
        output: str = "results",
        with_ids: bool = False,
        batch_size: int | None = None,
        cluster=None,
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
        frames = job.frames or ensure_auto_frames(output, job.dim, job.seed)
        self.workload = CubeWorkload(job, job.name or "cubes", frames)
        self.workload.writes_output = False
        self.workload.preflight()  # bad frames fail here, before any loader starts
        self.with_ids = with_ids
        self.batch_size = batch_size

    def __len__(self) -> int:
        n, b = self.workload.n_units, self.batch_size
        return n if b is None else -(-n // b)

    def __iter__(self):
        info = get_worker_info()
        if self.cluster is not None and self.cluster is not False:
            if info is not None:
                raise RuntimeError(
                    "CubeStream(cluster=...): the cluster's workers build the cubes; "
                    "use it with DataLoader(num_workers=0)"
                )
            yield from self._from_cluster()
            return
        if info is None:  # DataLoader(num_workers=0): threads of this process build
            yield from self._handed_over(thread_batches(self.workload, self.batch_size or 1))
            return
        n, b = self.workload.n_units, self.batch_size
        if b is None:
            yield from self._cubes(range(info.id, n, info.num_workers))
            return
        # Whole batches in turn, not cubes: batches of each worker's cubes ended in a
        # short batch per worker (50 cubes in 8s on 2 workers: 6 of 8, 2 of 1), and
        # more batches than len() said
        for j in range(info.id, -(-n // b), info.num_workers):
            yield self._batch(range(j * b, min(n, (j + 1) * b)))

    def _from_cluster(self):
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


class CubeShards(Dataset):
    """The cubes of job ``job`` stored under ``output`` (a folder or ``s3://`` prefix),
    as written by ``pipeline run`` with ``sink = "store"``. Without ``job``: the one
    job there, or ``output`` itself when it is a job's folder (``results/cubes``)."""

    def __init__(self, output: str, job: str | None = None, *, verify: bool = False):
        output, job = job_folder(output, job)
        if job is None:
            job = find_job(output)[0]
        self.output, self.job, self.verify = output, job, verify
        store = open_store(output)
        record_key, manifest_key = job_record_key(job), consolidated_manifest_key(job)
        if not store.exists(manifest_key):
            raise InputError(
                f"{store.describe(manifest_key)} does not exist: no complete cube job "
                f"{job!r} under {output} (run it with sink = 'store' to the end first)"
            )
        record = read_job_record(store, record_key)
        if record.get("workload") != "cubes":
            raise InputError(f"{store.describe(record_key)}: job {job!r} is not a cube job")
        fingerprint = record["fingerprint"]
        self.dim, self.dtype = int(fingerprint["dim"]), np.dtype(fingerprint["dtype"])
        manifest = read_parquet(store.open_input(manifest_key)).sort_by("cube_id")
        ids = manifest["cube_id"].to_numpy()
        if not np.array_equal(ids, np.arange(len(ids))):
            raise InputError(f"{store.describe(manifest_key)}: does not list cubes 0..n-1 once")
        shards = manifest["shard"].to_pylist()
        self._shard = shards
        self._offset = manifest["offset"].to_numpy()
        self._checksum = manifest["checksum"].to_pylist()
        per_shard: dict[str, int] = {}
        for key in shards:
            per_shard[key] = per_shard.get(key, 0) + 1
        self._cubes_in = per_shard
        self._local = not store.url.startswith("s3://")
        self._store = None  # reopened in each loader process (boto3 clients do not fork)
        self._maps: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._shard)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_store=None, _maps={})
        return state

    def __iter__(self) -> Iterator[torch.Tensor]:
        # Python's fallback iteration stops at any IndexError from __getitem__, which
        # made a damaged shard's cubes end the data without a word.
        for k in range(len(self)):
            yield self[k]

    def __getitem__(self, k: int) -> torch.Tensor:
        if isinstance(k, torch.Tensor) and k.ndim == 0 and not k.is_floating_point():
            k = int(k)
        if isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype.kind in "iu":
            k = int(k)
        if not isinstance(k, numbers.Integral) or isinstance(k, bool):
            raise TypeError(
                f"a cube's index is an integer, not {type(k).__name__} ({k!r}); "
                "a DataLoader (with a sampler or batch_size) reads many"
            )
        if not -len(self) <= k < len(self):
            raise IndexError(f"cube {k} out of range: the job has {len(self)} cubes")
        k = int(k) % len(self)
        shard, offset = self._shard[k], int(self._offset[k])
        raw = self._local_cube(shard, offset) if self._local else self._s3_cube(shard, offset)
        if self.verify:
            actual = checksum(raw)
            if actual != self._checksum[k]:
                raise StorageError(
                    f"{self._open().describe(shard)}[{offset}] (cube {k}): checksum "
                    f"{actual} != manifest {self._checksum[k]}"
                )
        d = self.dim
        cube = raw.view(self.dtype).reshape((d, d, d), order="F")
        return torch.from_numpy(cube)

    def _open(self):
        if self._store is None:
            self._store = open_store(self.output)
        return self._store

    def _local_cube(self, shard: str, offset: int) -> np.ndarray:
        """The cube's bytes, copied from a read-only mapping of its shard: tensors need
        writable memory, the file must not change, and a tensor changed in place (an
        augmentation) must not change the next read of its cube, as it did when one
        copy-on-write mapping of the shard served every read. (A private mapping per
        read instead: 913 cubes/s of 8 MB, against 2,179 for the copy and 2,471 for
        the shared mapping, reading each cube whole.)"""
        array = self._maps.get(shard)
        if array is None:
            path = self._open().describe(shard)
            d, n = self.dim, self._cubes_in[shard]
            mend = f"`pipeline verify {self.output} --repair` and a rerun of the job mend it"
            try:
                array = np.load(path, mmap_mode="r")
            except ValueError as exc:  # "mmap length is greater than file size"
                raise StorageError(
                    f"{path}: not a whole shard ({exc}): truncated? {mend}"
                ) from None
            except OSError as exc:
                raise StorageError(f"{path}: cannot be read ({exc.strerror}): {mend}") from None
            if array.shape != (d, d, d, n) or array.dtype != self.dtype:
                raise StorageError(
                    f"{path}: holds {array.dtype} cubes of shape {array.shape}, not the "
                    f"{n} {self.dtype} cubes of {d}^3 the manifest lists: {mend}"
                )
            self._maps[shard] = array
        return np.array(array[..., offset].reshape(-1, order="F").view(np.uint8))

    def _s3_cube(self, shard: str, offset: int) -> np.ndarray:
        d, n = self.dim, self._cubes_in[shard]
        cube_bytes = d**3 * self.dtype.itemsize
        start = len(npy_header((d, d, d, n), self.dtype.str)) + offset * cube_bytes
        data = self._open()._get(shard, Range=f"bytes={start}-{start + cube_bytes - 1}")
        if len(data) != cube_bytes:
            raise StorageError(
                f"{self._open().describe(shard)}: asked for {cube_bytes} bytes of cube "
                f"{offset} at {start}, got {len(data)}"
            )
        return np.frombuffer(bytearray(data), dtype=np.uint8)
