"""The ``pipeline`` joblib backend against joblib's default (loky), side by side in one
run on this machine (issue 45): ``Parallel(n_jobs=-1)`` of many short calls and of
fewer long ones, the same calls, the same number of worker processes (one per core).

Each call spins the CPU for its time (no sleep: both backends must compute it). The
embedded cluster's start, and loky's pool's, are timed apart (a warm-up call each),
as a program that calls ``Parallel`` more than once pays them once. Each case runs
``--repeats`` times, loky and pipeline in turn, and the bar is on the median of the
per-repeat ratios (pipeline time / loky time), so a slow phase of the machine
counts against both.

    python -m benchmarks.bench_joblib                      # 10,000 x 1 ms, 200 x 100 ms
    python -m benchmarks.bench_joblib --short 1000 --long 20 --repeats 1   # a quick look

Bar (issue 45.3): each case within 1.25x of loky's time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import joblib
from joblib import Parallel, delayed

import pipeline  # noqa: F401  (registers backend="pipeline")
from pipeline.joblib import close_sessions

BAR = 1.25


def spin(seconds: float) -> float:
    """Compute for ``seconds`` of this thread's CPU time (a call of that cost)."""
    end = time.thread_time() + seconds
    x = 0.0
    while time.thread_time() < end:
        x += 1.0
    return x


def timed(backend: str, calls: int, seconds: float, workers: int) -> float:
    with joblib.parallel_config(backend=backend, **_settings(backend, workers)):
        t0 = time.perf_counter()
        out = Parallel(n_jobs=-1 if backend == "pipeline" else workers)(
            delayed(spin)(seconds) for _ in range(calls)
        )
        elapsed = time.perf_counter() - t0
    assert len(out) == calls
    return elapsed


def _settings(backend: str, workers: int) -> dict:
    return {"workers": workers} if backend == "pipeline" else {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--short", type=int, default=10_000, help="calls of --short-ms")
    parser.add_argument("--short-ms", type=float, default=1.0)
    parser.add_argument("--long", type=int, default=200, help="calls of --long-ms")
    parser.add_argument("--long-ms", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    starts = {}
    for backend in ("loky", "pipeline"):  # pools and cluster started, timed apart
        t0 = time.perf_counter()
        timed(backend, 2 * args.workers, 0.001, args.workers)
        starts[backend] = time.perf_counter() - t0
    print(f"workers: {args.workers}; start (first Parallel call of 2 x workers calls): "
          f"loky {starts['loky']:.2f} s, pipeline {starts['pipeline']:.2f} s "
          "(the embedded cluster)")  # fmt: skip

    cases = [(args.short, args.short_ms / 1e3), (args.long, args.long_ms / 1e3)]
    failed = False
    for calls, seconds in cases:
        ratios, times = [], {"loky": [], "pipeline": []}
        for _ in range(args.repeats):
            for backend in ("loky", "pipeline"):
                times[backend].append(timed(backend, calls, seconds, args.workers))
            ratios.append(times["pipeline"][-1] / times["loky"][-1])
        ratio = statistics.median(ratios)
        ideal = calls * seconds / args.workers
        ok = ratio <= BAR
        failed |= not ok
        print(
            f"{calls:>7,} calls of {seconds * 1e3:g} ms: loky {min(times['loky']):.2f} s, "
            f"pipeline {min(times['pipeline']):.2f} s (best of {args.repeats}; ideal "
            f"{ideal:.2f} s); pipeline/loky median {ratio:.2f} "
            f"[{', '.join(f'{r:.2f}' for r in ratios)}] -> {'PASS' if ok else 'FAIL'} "
            f"(bar <= {BAR})"
        )
    close_sessions()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
