"""Benchmark the ``map`` workload against a plain loop and joblib on Dask.

For each function (a no-op, ~1 ms of work, ~100 ms of work), in one run on the same
embedded cluster: (a) a plain serial loop in this process; (b) ``joblib.Parallel``
on the Dask backend with the same function (``batch_size="auto"``); (c)
``pipeline.map`` over a grid, writing its results to a local folder. Prints
units/s, the per-unit overhead of (c) against the work ((c)'s worker-seconds per
unit minus the loop's seconds per unit), and (c)/(b).

    python -m benchmarks.bench_map [--workers 2] [--scale 1.0]

With ``--units``, jobs of many units instead: ``pipeline run`` of a job file whose
grid is a range (``i = {start = 0, stop = N}``), or with ``--grid csv`` or
``parquet`` a file of the points ``i = 0..N-1`` (one column ``i``; ``grid =
"points.csv"``), of a function returning ``{"y": 2 * i}`` (or busy for
``--unit-ms`` per unit), in a process of its own whose resident memory is sampled
every 20 ms. Prints the command's wall time (process start to exit) and units/s
over it, the driver's peak RSS and its excess over the same job of 1,000 units per
unit, the inputs' check (validation, the job's record; for a file, reading it and
writing its copy) and the probes' time, and the workers' busy share of the run and
of the whole command:

    python -m benchmarks.bench_map --units 1000000,10000000 [--repeat 3]
    python -m benchmarks.bench_map --units 10000000 --grid range,csv,parquet
    python -m benchmarks.bench_map --units 200000 --unit-ms 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def noop(x):
    return {"y": x}


def spin(x, seconds):
    """Busy work for about ``seconds`` (CPU, not sleep: it must occupy the worker)."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return {"y": x, "n": n}


CASES = [("no-op", 0.0, 20_000), ("1 ms", 0.001, 4_000), ("100 ms", 0.1, 60)]


def call(x, seconds):
    return noop(x) if seconds == 0 else spin(x, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="Multiply the unit counts.")
    parser.add_argument("--units", help="Jobs of these many units (comma-separated) instead.")
    parser.add_argument("--unit-ms", type=float, default=0.0, help="With --units: busy ms/unit.")
    parser.add_argument("--repeat", type=int, default=1, help="With --units: runs of each.")
    parser.add_argument("--grid", default="range",
                        help="With --units: the grid's forms, of range, csv, parquet.")  # fmt: skip
    args = parser.parse_args()
    if args.units:
        bench_units(args)
        return

    from joblib import Parallel, delayed, parallel_config

    import pipeline
    from pipeline import RunOptions, connect

    print(f"{'function':<8} {'units':>7} {'(a) loop/s':>11} {'(b) joblib/s':>13} "
          f"{'(c) map/s':>10} {'(c)/(b)':>8} {'(c)/(a)':>8} {'map overhead/unit':>18}")  # fmt: skip
    with connect(RunOptions(workers=args.workers)) as client, tempfile.TemporaryDirectory() as tmp:
        for label, seconds, units in CASES:
            n = max(10, int(units * args.scale))
            t0 = time.perf_counter()
            for x in range(n):
                call(x, seconds)
            loop = n / (time.perf_counter() - t0)

            with parallel_config(backend="dask", wait_for_workers_timeout=60):
                Parallel(n_jobs=-1)(delayed(call)(x, seconds) for x in range(min(n, 50)))  # warm
                t0 = time.perf_counter()
                Parallel(n_jobs=-1, batch_size="auto")(delayed(call)(x, seconds) for x in range(n))
                joblib_rate = n / (time.perf_counter() - t0)

            grid = {"x": list(range(n)), "seconds": [seconds]}
            t0 = time.perf_counter()
            s = pipeline.map(call, grid=grid, output=f"{tmp}/{label}", client=client,
                             progress=False)  # fmt: skip
            map_rate = n / (time.perf_counter() - t0)
            assert s.complete and s.units_failed == 0, s.failures[:3]
            overhead = s.busy_seconds / n - 1 / loop
            print(f"{label:<8} {n:>7,} {loop:>11,.0f} {joblib_rate:>13,.0f} {map_rate:>10,.0f} "
                  f"{map_rate / joblib_rate:>8.2f} {map_rate / loop:>8.2f} "
                  f"{overhead * 1e6:>15,.0f} us")  # fmt: skip


UNITS_MODULE = """
import time


def f(i):
    if SECONDS:
        end = time.perf_counter() + SECONDS
        while time.perf_counter() < end:
            pass
    return {"y": 2 * i}
"""


def points_file(folder: Path, n: int, form: str) -> Path:
    """The points ``i = 0..n-1`` as a CSV or parquet file (made once)."""
    path = folder / f"points{n}.{form}"
    if not path.exists():
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        if form == "csv":
            with path.open("w") as f:
                f.write("i\n")
                for first in range(0, n, 1_000_000):
                    f.writelines(f"{i}\n" for i in range(first, min(n, first + 1_000_000)))
        else:
            pq.write_table(pa.table({"i": np.arange(n, dtype=np.int64)}), path)
    return path


def run_units(folder: Path, n: int, workers: int, form: str = "range") -> dict:
    """``pipeline run`` of a job of ``n`` units in a process of its own; its figures."""
    import psutil

    job = folder / f"job{n}.toml"
    if form == "range":
        grid = f"[grid]\ni = {{start = 0, stop = {n}}}\n"
    else:
        grid = f'grid = "{points_file(folder, n, form)}"\n'
    job.write_text(f'workload = "map"\nfunction = "bench_units:f"\nworkers = {workers}\n' + grid)
    report, out = folder / "report", Path(tempfile.mkdtemp(dir=folder))
    command = [sys.executable, "-m", "pipeline", "run", str(job), "--output", str(out),
               "--report", str(report), "--no-progress"]  # fmt: skip
    log = (folder / "stderr.log").open("w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, cwd=folder, stdout=subprocess.DEVNULL, stderr=log)
    driver, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):  # (exited meanwhile)
            peak = max(peak, driver.memory_info().rss)
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    log.close()
    if proc.returncode:
        sys.stderr.write((folder / "stderr.log").read_text())
        raise SystemExit(f"{' '.join(command)} exited {proc.returncode}")
    shutil.rmtree(out)
    s = json.loads((report / f"job{n}-summary.json").read_text())
    probes = [t for t in s["task_timings"] if t["index"] < s["probe_tasks"]]
    probing = max((t["start"] + t["seconds"] for t in probes), default=0.0)
    busy = s["busy_seconds"] / s["workers"]
    return {"units": n, "wall": wall, "rss": peak, "inputs": s["startup"]["inputs checked"],
            "probing": probing, "run_busy": busy / s["wall_seconds"], "wall_busy": busy / wall,
            "tasks": s["tasks"]}  # fmt: skip


def bench_units(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "bench_units.py").write_text(
            f"SECONDS = {args.unit_ms / 1000!r}\n" + UNITS_MODULE
        )
        forms = args.grid.split(",")
        base = {form: run_units(folder, 1000, args.workers, form)["rss"] for form in forms}
        print(f"driver peak RSS of a job of 1,000 units: "
              f"{', '.join(f'{f} {b / 1e6:,.0f} MB' for f, b in base.items())}; "
              f"{args.unit_ms} ms of work per unit; {os.cpu_count()} cores, load "
              f"{os.getloadavg()[0]:.1f}")  # fmt: skip
        print(f"{'grid':>7} {'units':>11} {'wall':>7} {'units/s':>10} {'RSS MB':>7} "
              f"{'B/unit':>7} {'inputs':>7} {'probes':>7} {'tasks':>6} {'busy run':>9} "
              f"{'busy wall':>9}")  # fmt: skip
        for n in (int(u) for u in args.units.split(",")):
            for form in forms:
                if form != "range":
                    points_file(folder, n, form)  # (made before, not timed)
                for _ in range(args.repeat):
                    r = run_units(folder, n, args.workers, form)
                    print(f"{form:>7} {n:>11,} {r['wall']:>6.1f}s {n / r['wall']:>10,.0f} "
                          f"{r['rss'] / 1e6:>7,.0f} {(r['rss'] - base[form]) / n:>7.2f} "
                          f"{r['inputs']:>6.2f}s {r['probing']:>6.2f}s {r['tasks']:>6} "
                          f"{r['run_busy']:>9.2f} {r['wall_busy']:>9.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
