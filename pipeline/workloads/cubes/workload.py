"""Cube generation: d x d x d cubes stacked from d frames, written in .npy shards.

Cube k of a job takes the first d rows of each of the first d frames and d
columns drawn without replacement from columns 1..ncols-1 by a generator keyed
by (job seed, k), so any cube can be regenerated alone.

Memory layout: a cube is stored column-major (Fortran order) over its axes
(frame, row, column), because that makes building it one contiguous gather of
d blocks (see :func:`pipeline.workloads.cubes.frames.load_layout`). A shard of n cubes is a
Fortran-ordered ``.npy`` array of shape (d, d, d, n): ``np.load(shard)[..., i]``
is cube i with axes (frame, row, column), without a copy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import xxhash

from ...config import check_settings, setting
from ...errors import StorageError
from ...layout import attempt_key, consolidated_manifest_key, shard_key
from ...manifest import checksum, manifest_entries, summed_fingerprint
from ...storage import Store, checked_output, open_store, write_parquet
from ...workload import TableResults, Task, TaskOutput, UnitFailure, Workload
from .frames import (
    FrameSet,
    cached_layout,
    frame_keys,
    inspect_frames,
    load_layout,
    write_frames,
)
from .kernels import build_cube, build_cube_frames_first
from .shards import ShardSpec, read_shard, write_shards

__all__ = [
    "CubeJob",
    "CubeWorkload",
    "build_cube",
    "build_cube_frames_first",
    "cube_columns",
    "read_shard",
]

#: Frames made for a cube job that names none.
AUTO_FRAME_ROWS = 1000
AUTO_FRAME_COLS = 1000


@dataclass(frozen=True)
class CubeJob:
    """The settings of a cube job (job-file keys, ``--flags``, ``PIPELINE_*`` vars)."""

    def __post_init__(self) -> None:
        check_settings(self)

    name: str | None = setting(
        None,
        str,
        "Job id: names the job's folder in the output. Default: the job file's name, or 'cubes'.",
    )
    frames: str | None = setting(
        None,
        str,
        "Folder (or s3:// prefix) of parquet frames. "
        "Default: make dim frames of 1000x1000 under the output.",
    )
    cubes: int = setting(1000, int, "Number of cubes.", minimum=1)
    dim: int = setting(100, int, "Cube dimension d: d frames x d rows x d columns.", minimum=1)
    seed: int = setting(
        0, int, "Job seed; cube k's columns come from (seed, k).", minimum=0, below=2**64
    )  # (the key of a Philox generator: two 64-bit words, the seed and the cube id)
    sink: str = setting(
        "store",
        str,
        "store: write shards and a manifest; none: build "
        "cubes and discard them (measures generation alone).",
        choices=("store", "none"),
    )
    dtype: str = setting("float64", str, "Cube element type.", choices=("float64", "float32"))
    cubes_per_shard: int = setting(16, int, "Cubes per .npy shard.", minimum=1)
    per_layer_columns: bool = setting(
        False, bool, "Draw new columns for every layer instead of the same columns in every layer."
    )


def cube_columns(seed: int, cube_id: int, dim: int, n_cols: int, per_layer: bool) -> np.ndarray:
    """Column positions (1..n_cols-1) of cube ``cube_id``: shape (d,), or (d, d) per layer."""
    rng = _cube_rng(seed, cube_id)
    if per_layer:
        return np.stack([rng.choice(n_cols - 1, dim, replace=False) for _ in range(dim)]) + 1
    return rng.choice(n_cols - 1, dim, replace=False) + 1


_rngs = threading.local()


def _cube_rng(seed: int, cube_id: int) -> np.random.Generator:
    """Philox keyed by (seed, cube id): a counter-based generator, so each key is its
    own independent stream. One generator per thread, rekeyed per cube: making a new
    one costs 15 us, a few percent of building a cube."""
    rng = getattr(_rngs, "rng", None)
    if rng is None:
        rng = _rngs.rng = np.random.Generator(np.random.Philox(0))
    rng.bit_generator.state = {
        "bit_generator": "Philox",
        "state": {"counter": np.zeros(4, np.uint64), "key": np.array([seed, cube_id], np.uint64)},
        "buffer": np.zeros(4, np.uint64),
        "buffer_pos": 4,
        "has_uint32": 0,
        "uinteger": 0,
    }
    return rng


class CubeShards(TableResults):
    """The cubes' output: shards the tasks write, each task's entry its own."""

    #: An entry per cube: its shard, and where in it.
    manifest_columns = ("shard", "cube_id", None)

    @classmethod
    def verify_job(cls, store: Store, job_id: str, record: dict, manifest, check) -> set[str]:
        from .verify import check_cube_shards

        return check_cube_shards(store, manifest, check)

    @classmethod
    def finalize(cls, workload: Workload, store: Store, tasks: list[Task]) -> dict:
        job_id, n_units = workload.job_id, workload.n_units
        manifest = manifest_entries(store, job_id, tasks, order=cls.manifest_columns[1])
        if manifest.num_rows != n_units or manifest["cube_id"].to_pylist() != list(range(n_units)):
            raise StorageError(
                f"{store.describe(job_id)}: manifest parts do not list "
                f"cubes 0..{n_units - 1} exactly once"
            )
        write_parquet(store, consolidated_manifest_key(job_id), manifest)
        return {
            "manifest": store.describe(consolidated_manifest_key(job_id)),
            "shards": len(set(manifest["shard"].to_pylist())),
        }


class CubeWorkload(Workload):
    kind = "cubes"
    unit_name = "cube"
    work_name = "building"
    settings_class = CubeJob
    results = CubeShards

    def __init__(self, job: CubeJob, job_id: str, frames: FrameSet | str):
        self.job = job
        self.job_id = job_id
        self.n_units = job.cubes
        self.writes_output = job.sink == "store"
        self._frames_url = frames if isinstance(frames, str) else frames.url
        self.frames = frames if isinstance(frames, FrameSet) else None

    @classmethod
    def from_settings(cls, settings: CubeJob, job_id: str, options) -> CubeWorkload:
        return cls.from_job(settings, job_id, options.output)

    @classmethod
    def from_job(cls, job: CubeJob, job_id: str, output: str) -> CubeWorkload:
        frames = job.frames
        if frames is None:
            frames = ensure_auto_frames(output, job.dim, job.seed)
        return cls(job, job_id, frames)

    def input_urls(self) -> tuple[str, ...]:
        return (self._frames_url,)

    def preflight(self) -> None:
        if self.frames is None:
            self.frames = inspect_frames(self._frames_url, self.job.dim)

    def output_bytes(self, units: int) -> int | None:
        return units * self.job.dim**3 * np.dtype(self.job.dtype).itemsize

    def fingerprint(self) -> dict:
        j = self.job
        return {
            "frames": list(self.frames.keys),
            "frames_url": self.frames.url,
            # frames rewritten between a run and its resume: cubes of both, before
            "frame_versions": list(self.frames.versions),
            "cubes": j.cubes,
            "dim": j.dim,
            "seed": j.seed,
            "dtype": j.dtype,
            "cubes_per_shard": j.cubes_per_shard,
            "per_layer_columns": j.per_layer_columns,
        }

    def columns(self, cube_id: int) -> np.ndarray:
        return cube_columns(
            self.job.seed, cube_id, self.job.dim, self.frames.n_cols, self.job.per_layer_columns
        )

    def build_batch(self, ids: range, batch: np.ndarray) -> None:
        """Fill ``batch``, (d, d, d, n) Fortran-ordered, with cubes ``ids``: ``batch[..., i]``
        is cube ``ids[i]``, axes (frame, row, column)."""
        layout = self._layout()
        for i, cube_id in enumerate(ids):
            # batch[..., i].T is the C-ordered (column, row, frame) block build_cube fills
            build_cube(layout, self.columns(cube_id), batch[..., i].T)

    def cube(self, cube_id: int) -> np.ndarray:
        """Regenerate one cube alone, axes (frame, row, column)."""
        d = self.job.dim
        out = np.empty((d, d, d), dtype=self.job.dtype)
        build_cube(self._layout(), self.columns(cube_id), out)
        return out.T

    def _layout(self, cached_only: bool = False, by_frame: bool | None = None) -> np.ndarray | None:
        """The frames' layout for this job's cubes (by frame with ``by_frame``, the
        layout :func:`build_cube_frames_first` takes; by default as :func:`build_cube`
        takes it for this job); with ``cached_only``, None unless a process of this
        host has already built it (:func:`.frames.cached_layout`)."""
        by_frame = self.job.per_layer_columns if by_frame is None else by_frame
        args = (self.frames, self.job.dim, self.job.dtype, by_frame)
        return cached_layout(*args) if cached_only else load_layout(*args)

    @property
    def granularity(self) -> int:
        # Shard s always holds cubes s*cps .. (s+1)*cps-1, whatever the task sizes,
        # so the output bytes do not depend on how the run was planned.
        return self.job.cubes_per_shard if self.writes_output else 1

    def _shards(self, units: range):
        step = self.job.cubes_per_shard
        for first in range(units.start, units.stop, step):
            yield first // step, range(first, min(units.stop, first + step))

    def _shard_specs(self, layout, units: range, attempt: str) -> Iterator[ShardSpec]:
        d = self.job.dim
        for s, ids in self._shards(units):

            def fill(array: np.ndarray, ids: range = ids) -> list:
                rows = []
                for i, cube_id in enumerate(ids):
                    cols = self.columns(cube_id)
                    out = array[..., i].T  # C-contiguous (column, row, frame) view
                    build_cube(layout, cols, out)
                    digest = checksum(out)
                    rows.append((cube_id, i, cols.reshape(-1).astype(np.int32), digest))
                return rows

            yield self._shard_key(s, attempt), (d, d, d, len(ids)), self.job.dtype, fill

    def run_task(self, task: Task, store: Store | None) -> TaskOutput:
        t_inputs = time.perf_counter()
        layout = self._layout()
        t0 = time.perf_counter()
        inputs = t0 - t_inputs
        if store is None:
            out = self._run_discarding(layout, task, t0)
            out.phases = {"inputs": inputs, "compute": out.busy_seconds}
            out.busy_seconds += inputs  # loading the frames is the task's work too
            return out
        out = TaskOutput(phases={"inputs": inputs})
        manifest = {"cube_id": [], "shard": [], "offset": [], "columns": [], "checksum": []}
        ids_of = {self._shard_key(s, task.attempt): ids for s, ids in self._shards(task.units)}
        specs = self._shard_specs(layout, task.units, task.attempt)
        for key, rows, nbytes, error in write_shards(store, specs, out.phases):
            if error is not None:
                out.failures.extend(UnitFailure.from_exception(c, error) for c in ids_of[key])
                continue
            out.bytes_written += nbytes
            for cube_id, offset, cols, digest in rows:
                manifest["cube_id"].append(cube_id)
                manifest["shard"].append(key)
                manifest["offset"].append(offset)
                manifest["columns"].append(cols)
                manifest["checksum"].append(digest)
        out.manifest = pa.table(
            {
                "cube_id": pa.array(manifest["cube_id"], pa.int64()),
                "shard": pa.array(manifest["shard"], pa.string()),
                "offset": pa.array(manifest["offset"], pa.int32()),
                "columns": pa.array(manifest["columns"], pa.list_(pa.int32())),
                "checksum": pa.array(manifest["checksum"], pa.string()),
            }
        )
        # From the frames' loading on: a run's worker-seconds (its cost) and the
        # workers' busy share count it (an input-bound run was costed at a tenth)
        out.busy_seconds = time.perf_counter() - t_inputs
        return out

    def _shard_key(self, s: int, attempt: str) -> str:
        # Named by the attempt (as the runner names tables' parts): a copy or rerun of
        # the task never writes over a shard another attempt's entry lists; readers
        # find shards through the entries (their "shard" column), never by name.
        return attempt_key(shard_key(self.job_id, s), attempt)

    def _run_discarding(self, layout, task: Task, t0: float) -> TaskOutput:
        d = self.job.dim
        cube = np.empty((d, d, d), dtype=self.job.dtype)
        flat = cube.reshape(-1)
        stride = max(1, flat.size // 64)
        hashes = []
        for cube_id in task.units:
            build_cube(layout, self.columns(cube_id), cube)
            # A sparse sample of the built cube: cheap, and it changes if any cube
            # is not built, so a run that skipped work would show a different value.
            # Hashed with the cube's id and summed, the job's value is the same however
            # it was cut into tasks.
            hashes.append(xxhash.xxh3_64_intdigest(flat[::stride].tobytes(), seed=cube_id))
        return TaskOutput(
            fingerprint=summed_fingerprint(hashes), busy_seconds=time.perf_counter() - t0
        )


def auto_frames_url(output: str, dim: int, seed: int) -> str:
    return (
        f"{output.rstrip('/')}/inputs/frames-{dim}x{AUTO_FRAME_ROWS}x{AUTO_FRAME_COLS}-seed{seed}"
    )


def ensure_auto_frames(output: str, dim: int, seed: int, echo=print) -> str:
    """Make the default input frames under the output once, and return their URL."""
    checked_output(output)
    url = auto_frames_url(output, dim, seed)
    store = open_store(url)
    if len(frame_keys(store.list())[0]) < dim:
        echo(
            f"no --frames given: writing {dim} frames of {AUTO_FRAME_ROWS}x{AUTO_FRAME_COLS} "
            f"to {url}"
        )
        # (frames of an interrupted first run, the same bytes again)
        write_frames(
            store,
            "",
            count=dim,
            rows=AUTO_FRAME_ROWS,
            cols=AUTO_FRAME_COLS,
            seed=seed,
            overwrite=True,
        )
    return url
