"""CubeShards: a map-style PyTorch ``Dataset`` over a stored cube job, and a batch
reader of it into page-locked memory for a GPU (:meth:`CubeShards.batches`)."""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch.utils.data import Dataset

from ...errors import InputError, StorageError
from ...layout import consolidated_manifest_key, job_folder, job_record_key, read_job_record
from ...manifest import checksum
from ...results import find_job
from ...storage import open_store, read_parquet
from .delivery.parts import BatchMemory, batch_shape, batch_view
from .feed import to_device
from .gather import resolve_device
from .host_memory import HostMemory
from .sharding import Share
from .shards import npy_header

__all__ = ["CubeShards"]

#: Threads reading the cubes of a batch at once (local copies, or S3 ranged GETs).
READ_THREADS = 8


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
        self._local = not store.remote
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
        """Cube ``k``, a C-contiguous (d, d, d) tensor, axes (frame, row, column)."""
        k = self._index(k)
        cube = np.empty((self.dim,) * 3, dtype=self.dtype)
        self._read_into(k, cube)
        return torch.from_numpy(cube)

    def batches(
        self,
        batch_size: int,
        *,
        device=None,
        ids: Sequence[int] | None = None,
        threads: int = READ_THREADS,
        drop_last: bool = False,
        pinned_gib: float | None = None,
    ) -> Iterator[torch.Tensor]:
        """Cubes ``ids`` in order, ``batch_size`` at a time, as C-contiguous (n, d, d, d)
        tensors, axes (cube, frame, row, column). Default ids: this process's share
        under ``torch.distributed``, as ``DistributedSampler(shuffle=False)`` shares:
        cubes ``rank, rank + world, ...`` padded by repeating from cube 0 so every rank
        has as many (``drop_last``: cut instead); every cube with one process. Shuffle
        by passing a permutation (of this rank's share).

        Each batch is read (``threads`` cubes at a time) into a buffer of its own,
        page-locked when ``device`` is a CUDA GPU (as stored, at most ``pinned_gib``:
        :mod:`.host_memory`), and copied from there to the device while the next one
        is read (:func:`.feed.to_device`), which puts it in the training layout.
        Without ``device`` the batches are CPU tensors sharing their buffer's memory;
        a buffer is reused once the last of them is dropped."""
        if not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batches: batch_size={batch_size!r}; expected an integer >= 1")
        if ids is None:
            ids = Share.of_rank(len(self), None, drop_last)
        ids = [self._index(k) for k in ids]
        dev = None if device is None else resolve_device(device, "CubeShards.batches")
        memory = HostMemory(dev, pinned_gib) if dev is not None else None
        if memory is not None:  # the first buffer must fit; refused before it is made
            n = min(batch_size, max(1, len(ids)))
            what = f"batch buffer ({n} cubes of {self.dim}³ {self.dtype})"
            memory.reserve(1, n * self.dim**3 * self.dtype.itemsize, what)
        as_stored = dev is not None and dev.type == "cuda"  # the GPU transposes
        source = self._read_batches(ids, batch_size, memory, threads, not as_stored)
        return source if dev is None else to_device(source, dev, memory=memory)

    def _read_batches(
        self, ids: list[int], batch_size: int, memory, threads: int, contiguous: bool
    ):
        d, dtype = self.dim, self.dtype
        free: list[np.ndarray] = []
        batch_size = min(batch_size, max(1, len(ids)))  # buffers no larger than the job

        def new_buffer() -> np.ndarray:
            if memory is not None:
                return memory.empty((batch_size * d**3,), dtype)
            return np.empty(batch_size * d**3, dtype=dtype)

        with ThreadPoolExecutor(max(1, threads)) as pool:
            for start in range(0, len(ids), batch_size):
                chosen = ids[start : start + batch_size]
                flat = free.pop() if free else new_buffer()
                array = batch_view(flat, d, len(chosen), contiguous)
                cubes = [array[i] if contiguous else array[..., i] for i in range(len(chosen))]
                list(pool.map(self._read_into, chosen, cubes))
                shape = batch_shape(d, len(chosen), contiguous)
                owner = BatchMemory(flat, shape, dtype, contiguous)
                weakref.finalize(owner, free.append, flat)  # reused once dropped
                batch = torch.from_numpy(np.asarray(owner))
                if not contiguous:
                    batch = batch.permute(3, 0, 1, 2)  # (cube, frame, row, column)
                del owner, flat, array, cubes
                yield batch
                del batch

    def _index(self, k) -> int:
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
        return int(k) % len(self)

    def _read_into(self, k: int, out: np.ndarray) -> None:
        """Cube ``k`` into ``out``, a (d, d, d) array with axes (frame, row, column) in
        any order in memory (copied, and transposed if not as stored), its stored bytes
        checked if ``verify``."""
        shard, offset = self._shard[k], int(self._offset[k])
        read = self._local_cube if self._local else self._s3_cube
        stored = read(shard, offset)
        if self.verify:
            actual = checksum(stored)
            if actual != self._checksum[k]:
                raise StorageError(
                    f"{self._open().describe(shard)}[{offset}] (cube {k}): checksum "
                    f"{actual} != manifest {self._checksum[k]}"
                )
        d = self.dim
        np.copyto(out, stored.view(self.dtype).reshape((d, d, d), order="F"))

    def _open(self):
        if self._store is None:
            self._store = open_store(self.output)
        return self._store

    def _local_cube(self, shard: str, offset: int) -> np.ndarray:
        """The cube's bytes in a read-only mapping of its shard, to be copied: tensors
        need writable memory, the file must not change, and a tensor changed in place
        (an augmentation) must not change the next read of its cube, as it did when
        one copy-on-write mapping of the shard served every read. (A private mapping
        per read instead: 913 cubes/s of 8 MB, against 2,179 for the copy and 2,471
        for the shared mapping, reading each cube whole.)"""
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
        return array[..., offset].reshape(-1, order="F").view(np.uint8)

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
        return np.frombuffer(data, dtype=np.uint8)
