"""iter_cubes over the integration tests' production topology: a TLS `dask scheduler`
behind HAProxy and `dask worker --nthreads 1` processes (harness/cluster_procs.py),
all on loopback, the consumer reading every cube (float(cube.sum())):

  relayed   delivery="dask", direct_to_workers=False: worker -> scheduler -> consumer
  direct    delivery="dask", direct_to_workers=True: worker -> consumer over TLS
  shared    delivery="shared-memory": the workers are on this host after all

Loopback has no network bound, so this shows what each path costs in CPU (TLS,
serialization, the scheduler's relay) on the same cores that build the cubes.

  python -m benchmarks.bench_delivery_remote --frames FRAMES_DIR --cubes 1000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

from pipeline import CubeJob, iter_cubes
from pipeline.workloads.cubes.delivery import RelayedThroughSchedulerWarning


def rate(client, job: CubeJob, delivery: str) -> float:
    t0 = time.perf_counter()
    total, n = 0.0, 0
    for _k, cube in iter_cubes(job, client=client, delivery=delivery):
        total += float(cube.sum())
        n += 1
    assert n == job.cubes
    return n / (time.perf_counter() - t0)


def main() -> None:
    from harness.cluster_procs import tls_cluster
    from pipeline.storage import LocalStore
    from pipeline.workloads.cubes.frames import write_frames

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--frames", type=Path, help="frames folder (default: make dim of 1000x1000)")
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--cubes", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    warnings.simplefilter("ignore", RelayedThroughSchedulerWarning)
    with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp:
        frames = args.frames
        if frames is None:
            frames = Path(tmp) / "frames"
            write_frames(LocalStore(frames), "", count=args.dim, rows=1000, cols=1000, seed=0)
        job = CubeJob(frames=str(frames), cubes=args.cubes, dim=args.dim, seed=1)
        with tls_cluster(tmp, n_workers=args.workers) as cluster:
            print(
                f"TLS scheduler behind HAProxy at {cluster.address}, {args.workers} workers; "
                f"{args.cubes} cubes of {args.dim}^3 per round; load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            results = {}
            for name, direct, delivery in (
                ("relayed", False, "dask"),
                ("direct", True, "dask"),
                ("shared", False, "shared-memory"),
            ):
                with cluster.client(direct_to_workers=direct) as client:
                    rates = [rate(client, job, delivery) for _ in range(args.rounds)]
                results[name] = max(rates)
                cube_mb = args.dim**3 * 8 / 1e6
                print(
                    f"  {name:8s} {max(rates):8,.0f} cubes/s = "
                    f"{max(rates) * cube_mb / 1e3:.2f} GB/s (rounds: "
                    + ", ".join(f"{r:,.0f}" for r in rates)
                    + ")",
                    flush=True,
                )
            print(
                f"ratios: direct/relayed = {results['direct'] / results['relayed']:.2f}, "
                f"shared/direct = {results['shared'] / results['direct']:.2f}; "
                f"load {os.getloadavg()[0]:.1f}"
            )


if __name__ == "__main__":
    main()
