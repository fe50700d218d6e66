"""Cube jobs for the tests: a small job as the command line would make it, run on a
client, and its manifest."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import xxhash

from pipeline import load_jobs, run_job
from pipeline.errors import StorageError
from pipeline.layout import shard_key
from pipeline.workloads.cubes.workload import CubeWorkload


def cube_job(out, frames_dir, **settings):
    cli = {
        "output": str(out),
        "frames": str(frames_dir),
        "cubes": 40,
        "dim": 10,
        "seed": 3,
        "cubes_per_shard": 4,
        "progress": False,
        **settings,
    }
    (job,) = load_jobs([], cli, environ={})
    return job


def run(job, client, messages=None):
    echo = messages.append if messages is not None else (lambda m: None)
    return run_job(job.build(), job.options, client, echo=echo)


def load_manifest(out, job_id="cubes"):
    return pq.read_table(out / job_id / "manifest.parquet").to_pandas()


def cube_digest(cube) -> str:
    """A cube's bytes (a numpy array, or a torch tensor on the CPU) as one digest."""
    array = cube if isinstance(cube, np.ndarray) else cube.numpy()
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(array))


def shard_file(out, shard: int, job_id: str = "cubes") -> Path:
    """Shard ``shard``'s file in a job written once (its name carries the attempt that
    wrote it, ``NNNNNN.aXXXXXXXX.npy``: one such file per shard)."""
    (path,) = (Path(out) / job_id / "shards").glob(f"{shard:06d}.a*.npy")
    return path


def unattempted(key: str) -> str:
    """An object's key without the attempt in its name (``000003.a1b2c3d4.npy`` ->
    ``000003.npy``): what two runs of a deterministic job share."""
    return re.sub(r"\.a[0-9a-f]{8}(?=\.)", "", key)


class CubesFailingAShard(CubeWorkload):
    """Cubes whose shard ``shard`` is not written while the file ``block`` exists: making
    it raises a StorageError naming it, as a full disk would, so its cubes fail."""

    def __init__(self, job, job_id, frames, shard: int, block):
        super().__init__(job, job_id, frames)
        self.shard, self.block = shard, str(block)

    @classmethod
    def of(cls, workload: CubeWorkload, shard: int, block) -> CubesFailingAShard:
        frames = workload.frames or workload.input_urls()[0]
        return cls(workload.job, workload.job_id, frames, shard, block)

    def _shard_specs(self, layout, units, attempt):
        blocked_key = shard_key(self.job_id, self.shard)
        for key, shape, dtype, fill in super()._shard_specs(layout, units, attempt):
            if unattempted(key) == blocked_key:
                fill = self._blocked(key, fill)
            yield key, shape, dtype, fill

    def _blocked(self, key, fill):
        def blocked(array):
            if os.path.exists(self.block):
                raise StorageError(f"{key}: not written (the test's {self.block} exists)")
            return fill(array)

        return blocked
