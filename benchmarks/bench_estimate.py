"""How close `pipeline estimate`'s projection comes to the real run, on this machine.

For each job, each on an embedded cluster of its own: (a) the estimate (the job's probe tasks into
a scratch folder, then the projection for this cluster's workers); (b) the real
run of the same job. Prints the projected and the measured wall time, their
ratio, the binding limit, the probes' share of the job's units, and the cost.

Jobs: (1) `map` over a grid, a fixed amount of numpy work per point (CPU: it
slows down under load as a real job would); (2) per-chunk OLS regressions on the
demo panel (`pipeline data regressions`).

    python -m benchmarks.bench_estimate [--workers 2] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

WORK = '''import numpy as np


def work(x, seed):
    """A fixed amount of linear algebra per point."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(90, 90))
    for _ in range(6):
        a = np.linalg.qr(a)[0] @ a
    return {"x": x, "trace": float(np.trace(a))}
'''


def job_files(folder: Path, scale: float) -> list[Path]:
    from pipeline.storage import LocalStore
    from pipeline.workloads.regressions import write_regression_data

    (folder / "benchwork.py").write_text(WORK)
    points = int(1500 * scale)
    grid = folder / "grid.toml"
    header = 'workload = "map"\nfunction = "benchwork:work"\nseed = 1\n'
    grid.write_text(f"{header}[grid]\nx = {list(range(points))}\n")
    chunks = int(3000 * scale)
    data = folder / "panel"
    write_regression_data(LocalStore(data), "", chunks=chunks, rows=250, features=5, seed=0)
    regress = folder / "fits.toml"
    regress.write_text(
        f'workload = "regressions"\ndata = "{data}"\nmodel = "ols"\n'
        'formula = "y ~ x1 + x2 + x3 + x4 + x5 + C(sector)"\nchunk_by = "chunk"\n'
    )
    return [grid, regress]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()

    from pipeline.cluster.connect import connect
    from pipeline.costs.estimate import estimate
    from pipeline.costs.run_cost import limit_name
    from pipeline.jobs import load_jobs
    from pipeline.runner import run_job
    from pipeline.summary import usd

    print(f"load average before: {os.getloadavg()[0]:.1f}; {args.workers} workers")
    with tempfile.TemporaryDirectory(prefix="bench-estimate-") as tmp:
        folder = Path(tmp)
        sys.path.insert(0, str(folder))
        files = job_files(folder, args.scale)
        cli = {"output": str(folder / "out"), "workers": args.workers, "progress": False}
        jobs = load_jobs([str(f) for f in files], cli)
        for job in jobs:
            # A cluster each, as `pipeline estimate` and `pipeline run` have: both
            # start with cold workers (imports, caches).
            with connect(job.options) as client:
                t0 = time.perf_counter()
                est = estimate(
                    lambda o, job=job: dataclasses.replace(job, options=o).build(),
                    job.options,
                    client,
                    [],
                )
                est_seconds = time.perf_counter() - t0
            here = est.projections[0]
            with connect(job.options) as client:
                s = run_job(job.build(), job.options, client, echo=lambda m: None)
            ratio = here.wall_seconds / s.wall_seconds
            print(
                f"{est.workload:12s} {est.units:6,} {est.unit_name}s: projected "
                f"{here.wall_seconds:6.1f} s ({limit_name(here, here.binding)}), measured "
                f"{s.wall_seconds:6.1f} s, ratio {ratio:.2f}; the estimate took "
                f"{est_seconds:.1f} s, it ran "
                f"{est.sampled / est.units:.0%} of the units; run cost "
                f"{usd(s.cost_usd or 0)} (busy worker-seconds), projected {usd(here.cost_usd)} "
                "(workers x wall)"
            )
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
