#!/usr/bin/env python3
"""Cube generation benchmark: this project against the reference method, in one run,
on the same frames and machine.

  (a) reference: all frames in one float64 array (frames, rows, cols); each cube is
      arr[:, :d, cols] with cols = random.sample(range(1, ncols), d), on a
      multiprocessing.pool.ThreadPool of one thread per core with imap_unordered;
  (b) this project's cube kernel alone (columns + gather), one thread;
  (c) the machine's rate of copying 8 MB (one d=100 float64 cube) from a large
      array into a fresh array, one thread;
  (d) `pipeline run --sink none` on the embedded cluster;
  (e) the same to the local store, next to (f) the machine's sequential write rate
      for the same number of bytes.

  python scripts/bench_cubes.py                 # 100 frames of 1000x1000, d = 100
  python scripts/bench_cubes.py --store-cubes 500 --none-cubes 20000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from multiprocessing.pool import ThreadPool
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import load_jobs, run_jobs  # noqa: E402
from pipeline.cubes import build_cube, cube_columns  # noqa: E402
from pipeline.frames import inspect_frames, load_layout, write_frames  # noqa: E402
from pipeline.storage import LocalStore  # noqa: E402


def load_reference_array(frame_files: list[Path], d: int, column_major: bool) -> np.ndarray:
    frames = [pq.read_table(f).to_pandas().to_numpy(dtype=np.float64) for f in frame_files[:d]]
    if column_major:
        # np.stack of pandas' arrays keeps their column-major layout: a lucky case
        # for arr[:, :d, cols], shown for transparency.
        return np.stack(frames)
    return np.array(frames)  # one C-ordered (frames, rows, cols) array


def reference(arr: np.ndarray, d: int, n: int, threads: int) -> float:
    ncols = arr.shape[2]

    def make_cube(_i):
        cols = random.sample(range(1, ncols), d)
        return arr[:, :d, cols]

    random.seed(0)
    t0 = time.perf_counter()
    with ThreadPool(threads) as pool:
        done = sum(1 for _ in pool.imap_unordered(make_cube, range(n)))
    return done / (time.perf_counter() - t0)


def kernel(frames_dir: Path, d: int, n: int) -> float:
    frames = inspect_frames(str(frames_dir), d)
    layout = load_layout(frames, d, "float64")
    build_cube(layout, cube_columns(0, 0, d, frames.n_cols, False), np.empty((d, d, d)))
    t0 = time.perf_counter()
    for k in range(n):  # into a fresh array each time, like (c)
        build_cube(layout, cube_columns(0, k, d, frames.n_cols, False), np.empty((d, d, d)))
    return n / (time.perf_counter() - t0)


def copy_rate(nbytes: int, n: int) -> float:
    count = nbytes // 8
    big = np.random.default_rng(0).random(count * 100)
    rng = np.random.default_rng(1)
    big[:count].copy()
    t0 = time.perf_counter()
    for _ in range(n):
        start = int(rng.integers(0, big.size - count))
        big[start : start + count].copy()
    return n / (time.perf_counter() - t0)


def runner(frames_dir: Path, d: int, n: int, sink: str, output: Path, workers: int) -> dict:
    cli = {
        "frames": str(frames_dir),
        "cubes": n,
        "dim": d,
        "seed": 1,
        "sink": sink,
        "output": str(output),
        "overwrite": True,
        "progress": False,
        "workers": workers,
        "name": f"bench-{sink}",
    }
    (summary,) = run_jobs(load_jobs([], cli, environ={}), echo=lambda m: None)
    assert summary.complete, summary.failures[:3]
    return {
        "cubes_per_s": summary.units_per_second,
        "wall_s": summary.wall_seconds,
        "bytes": summary.bytes_written,
        "units_per_task": summary.units_per_task,
        "tasks": summary.tasks,
    }


def write_rate(path: Path, nbytes: int, chunk: int = 128 << 20) -> float:
    buf = np.random.default_rng(2).random(chunk // 8)
    mv = memoryview(buf).cast("B")
    t0 = time.perf_counter()
    written = 0
    with open(path, "wb") as f:
        while written < nbytes:
            written += f.write(mv[: min(chunk, nbytes - written)])
    elapsed = time.perf_counter() - t0
    path.unlink()
    return written / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--frames", type=Path, help="frames folder (default: make 100x1000x1000)")
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--ref-cubes", type=int, default=1000)
    ap.add_argument("--kernel-cubes", type=int, default=3000)
    ap.add_argument("--none-cubes", type=int, default=20000)
    ap.add_argument("--store-cubes", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--workdir", type=Path, help="scratch space (default: a temp dir)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-cubes-", dir=args.workdir))
    try:
        frames_dir = args.frames
        if frames_dir is None:
            frames_dir = work / "frames"
            write_frames(LocalStore(frames_dir), "", count=args.dim, rows=1000, cols=1000, seed=0)
        files = sorted(frames_dir.glob("*.parquet"))
        d, cores = args.dim, os.cpu_count()
        cube_bytes = d**3 * 8
        print(f"machine: {cores} cores; frames: {len(files)} in {frames_dir}; d = {d}", flush=True)

        # A fresh layout cache: (d) pays for reading the frames, (e) reuses them.
        os.environ["PIPELINE_CACHE_DIR"] = str(work / "cache")
        arr = load_reference_array(files, d, column_major=False)
        a = reference(arr, d, args.ref_cubes, cores)
        print(f"(a) reference, ThreadPool({cores})       {a:10,.0f} cubes/s", flush=True)
        arr = load_reference_array(files, d, column_major=True)
        a_cm = reference(arr, d, args.ref_cubes, cores)
        del arr
        print(f"(a') same, frames kept column-major   {a_cm:10,.0f} cubes/s", flush=True)
        b = kernel(frames_dir, d, args.kernel_cubes)
        print(f"(b) kernel, 1 thread                  {b:10,.0f} cubes/s", flush=True)
        c = copy_rate(cube_bytes, args.kernel_cubes)
        print(f"(c) 8 MB copy, 1 thread               {c:10,.0f} copies/s", flush=True)
        dd = runner(frames_dir, d, args.none_cubes, "none", work / "out", args.workers)
        print(
            f"(d) pipeline run --sink none          {dd['cubes_per_s']:10,.0f} cubes/s "
            f"({args.none_cubes} cubes, {args.workers} workers, {dd['tasks']} tasks of "
            f"{dd['units_per_task']}, {dd['wall_s']:.1f} s, frames read cold)",
            flush=True,
        )
        # The write rate of a virtual disk depends on whether its blocks were written
        # before: a warm-up write first, then the write rate measured right before and
        # right after (e), each into space the previous step freed, like (e).
        store_bytes = args.store_cubes * cube_bytes
        write_rate(work / "write-test.bin", store_bytes)
        f1 = write_rate(work / "write-test.bin", store_bytes)
        e = runner(frames_dir, d, args.store_cubes, "store", work / "out", args.workers)
        e_rate = e["bytes"] / e["wall_s"]
        shutil.rmtree(work / "out", ignore_errors=True)
        f2 = write_rate(work / "write-test.bin", store_bytes)
        f = (f1 + f2) / 2
        print(
            f"(e) pipeline run --sink store         {e['cubes_per_s']:10,.0f} cubes/s "
            f"= {e_rate / 1e9:.2f} GB/s ({e['bytes'] / 1e9:.1f} GB, {e['wall_s']:.1f} s, "
            "layout cache warm from (d))",
            flush=True,
        )
        print(
            f"(f) sequential write, same bytes      {f / 1e9:10.2f} GB/s "
            f"(before (e): {f1 / 1e9:.2f}, after: {f2 / 1e9:.2f})",
            flush=True,
        )
        ratios = {
            "b/c": b / c,
            "d/a": dd["cubes_per_s"] / a,
            "e/f": e_rate / f,
            "d/a_column_major": dd["cubes_per_s"] / a_cm,
        }
        print(
            f"ratios: (b)/(c) = {ratios['b/c']:.2f} (target >= 0.8), "
            f"(d)/(a) = {ratios['d/a']:.1f} (target >= 8), "
            f"(e)/write rate = {ratios['e/f']:.2f} (target >= 0.8); "
            f"(d)/(a') = {ratios['d/a_column_major']:.1f}"
        )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "a": a,
                        "a_column_major": a_cm,
                        "b": b,
                        "c": c,
                        "d": dd,
                        "e": e,
                        "write_rate": f,
                        "ratios": ratios,
                    },
                    indent=2,
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
