"""Cube jobs for the tests: a small job as the command line would make it, run on a
client, and its manifest."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import xxhash

from pipeline import load_jobs, run_job


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
