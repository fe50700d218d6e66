"""What the training layout costs: cubes built C-contiguous (n, d, d, d), axes (cube,
frame, row, column), against cubes as built and stored (Fortran order), on the CPU.

  (k) the kernel alone, one thread, a whole cube at a time: ``build_cube`` (d block
      copies, the stored layout) against ``build_cube_frames_first`` (each frame's
      columns gathered and transposed in the cache), in alternating rounds, the best
      round of each;
  (s) ``CubeStream(job)`` read by a loop (``float(x.sum())`` per item, torch on one
      thread as docs/cubes.md advises), built by threads of this process, one cube at
      a time and in batches of 8, in each layout, in alternating rounds, the median
      round reported.

  python -m benchmarks.bench_cube_layout                # d = 100 float64, 100 frames
  python -m benchmarks.bench_cube_layout --dtype float32 --cubes 3000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def kernel(job, rounds: int, n: int) -> dict[str, float]:
    """Best ms a cube of each kernel, one thread."""
    from pipeline import CubeWorkload
    from pipeline.workloads.cubes.workload import build_cube, build_cube_frames_first

    workload = CubeWorkload(job, "cubes", job.frames)
    workload.preflight()
    d = job.dim
    kernels = {
        "as built": (workload._layout(by_frame=False), build_cube),
        "training layout": (workload._layout(by_frame=True), build_cube_frames_first),
    }
    columns = [workload.columns(k) for k in range(n)]
    out = np.empty((d, d, d), dtype=job.dtype)
    best = dict.fromkeys(kernels, float("inf"))
    for _ in range(rounds):
        for name, (layout, build) in kernels.items():
            t0 = time.perf_counter()
            for cols in columns:
                build(layout, cols, out)
            best[name] = min(best[name], (time.perf_counter() - t0) / n * 1e3)
    return best


def stream(job, rounds: int) -> dict[str, float]:
    """Median cubes/s a loop reads from CubeStream, in each layout and batch size."""
    import torch

    from pipeline.torch import CubeStream

    torch.set_num_threads(1)
    cases = {
        f"{name}, batch_size={b}": dict(batch_size=b, contiguous=contiguous)
        for b in (None, 8)
        for name, contiguous in (("as built", False), ("training layout", True))
    }
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, settings in cases.items():
            t0 = time.perf_counter()
            for x in CubeStream(job, **settings):
                float(x.sum())
            rates[name].append(job.cubes / (time.perf_counter() - t0))
    return {name: statistics.median(r) for name, r in rates.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--frames", type=Path, help="frames folder (default: 100 of 100 x 1000)")
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--cubes", type=int, default=2000, help="cubes a round of (s)")
    ap.add_argument("--kernel-cubes", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from pipeline import CubeJob
    from pipeline.storage import LocalStore
    from pipeline.workloads.cubes.frames import write_frames

    with tempfile.TemporaryDirectory() as tmp:
        frames = args.frames
        if frames is None:
            frames = Path(tmp, "frames")
            write_frames(LocalStore(frames), "", count=100, rows=100, cols=1000, seed=1)
        job = CubeJob(frames=str(frames), cubes=args.cubes, dim=args.dim, seed=1, dtype=args.dtype)
        print(f"d = {args.dim} {args.dtype}, {args.rounds} rounds")
        for name, ms in kernel(job, args.rounds, args.kernel_cubes).items():
            print(f"(k) kernel, {name:<20} {ms:8.3f} ms a cube (best round)")
        for name, rate in stream(job, args.rounds).items():
            print(f"(s) CubeStream, {name:<35} {rate:8,.0f} cubes/s (median round)")


if __name__ == "__main__":
    main()
