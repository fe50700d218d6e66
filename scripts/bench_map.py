#!/usr/bin/env python3
"""Benchmark the ``map`` workload against a plain loop and joblib on Dask.

For each function (a no-op, ~1 ms of work, ~100 ms of work), in one run on the same
embedded cluster: (a) a plain serial loop in this process; (b) ``joblib.Parallel``
on the Dask backend with the same function (``batch_size="auto"``); (c)
``pipeline.map`` over a grid, writing its results to a local folder. Prints
units/s, the per-unit overhead of (c) against the work ((c)'s worker-seconds per
unit minus the loop's seconds per unit), and (c)/(b).

    python scripts/bench_map.py [--workers 2] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import tempfile
import time


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
    args = parser.parse_args()

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


if __name__ == "__main__":
    main()
