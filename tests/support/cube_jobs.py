"""Cube jobs for the tests: a small job as the command line would make it, run on a
client, and its manifest."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import xxhash

from pipeline import load_jobs, run_job
from pipeline.errors import StorageError
from pipeline.layout import shard_key
from pipeline.workloads.cubes.workload import CubeWorkload
from support.stored import unnamed


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
            if unnamed(key) == blocked_key:
                fill = self._blocked(key, fill)
            yield key, shape, dtype, fill

    def _blocked(self, key, fill):
        def blocked(array):
            if os.path.exists(self.block):
                raise StorageError(f"{key}: not written (the test's {self.block} exists)")
            return fill(array)

        return blocked


#: Set on the thread running the gated task's first attempt (tests/test_commit_once_cubes.py).
_first_attempt = threading.local()


class GatedCubes(CubeWorkload):
    """Cubes whose task ``gated``'s first attempt waits (at most 120 s) for the file
    ``gate``, then builds its cubes as ``mode`` says: "same" (the same bytes), "other"
    (from other columns: a build that is not deterministic) or "fails" (its last shard
    fails). Every attempt of the task appends how it ran ("first", "again") to
    ``log/ended`` once its cubes are built."""

    def __init__(self, job, job_id, frames, gate, log, gated: int = 1, mode: str = "same"):
        super().__init__(job, job_id, frames)
        self.gate, self.log, self.gated, self.mode = str(gate), str(log), gated, mode

    @classmethod
    def of(cls, workload: CubeWorkload, gate, log, gated=1, mode="same") -> GatedCubes:
        frames = workload.frames or workload.input_urls()[0]
        return cls(workload.job, workload.job_id, frames, gate, log, gated, mode)

    def run_task(self, task, store):
        if task.index != self.gated:
            return super().run_task(task, store)
        first = _exclusive(Path(self.log) / "first")
        if first:
            deadline = time.monotonic() + 120
            while not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.02)
        _first_attempt.on = first and self.mode != "same"
        try:
            return super().run_task(task, store)
        finally:
            _first_attempt.on = False
            with open(Path(self.log) / "ended", "a") as f:
                f.write("first\n" if first else "again\n")

    def columns(self, cube_id):
        cols = super().columns(cube_id)
        if getattr(_first_attempt, "on", False) and self.mode == "other":
            return np.roll(cols, 1, axis=-1)
        return cols

    def _shard_specs(self, layout, units, attempt):
        specs = list(super()._shard_specs(layout, units, attempt))
        if getattr(_first_attempt, "on", False) and self.mode == "fails":
            key, shape, dtype, _fill = specs[-1]
            specs[-1] = (key, shape, dtype, _raises(key))
        return specs

    def ended(self) -> list[str]:
        path = Path(self.log) / "ended"
        return path.read_text().split() if path.exists() else []


def _exclusive(path: Path) -> bool:
    """Whether this caller created ``path`` (of several, one does)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _raises(key):
    def fill(array):
        raise StorageError(f"{key}: the first attempt fails it")

    return fill
