"""Profile one regression task end to end, in this process (no cluster).

For each case (the default and heavy cases of ``bench_regressions.py``, and a
categorical-heavy formula) it writes a dataset, plans the job and runs one task
(``run_task``: read the rows, build the design, fit, build and serialize the
tables) under cProfile, printing the top functions by cumulative and own time.

    python -m benchmarks.profile_regressions --case default --engine auto
    python -m benchmarks.profile_regressions --case all --dump /tmp/prof   # .pstats files
    python -m benchmarks.profile_regressions --case default --lines        # line_profiler

``--lines`` needs ``pip install line_profiler``; it reports the hot functions of
``pipeline.workloads.regressions`` line by line.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import time
import warnings
from pathlib import Path

# One BLAS thread, as on the workers (set before numpy loads BLAS).
for _var in ("MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

# chunks, rows, features, cov_type, maxlags, chunks in the profiled task
CASES = {
    "default": (2_000, 250, 5, "nonrobust", None, 2_000),
    "heavy": (20, 50_000, 20, "HAC", 10, 20),
    "categorical": (2_000, 250, 5, "nonrobust", None, 2_000),
}
# The categorical-heavy case: a 12-level factor, two interactions, a second factor.
CATEGORICAL_FORMULA = "y ~ x1 + x2 + x3 + C(sector) * x4 + C(region) + C(region):x5"


def write_data(name: str, root: Path) -> tuple[str, str]:
    from pipeline.storage import LocalStore
    from pipeline.workloads.regressions import write_regression_data
    from pipeline.workloads.regressions.generate import regression_formula

    chunks, rows, features, *_ = CASES[name]
    path = root / f"data-{name}"
    write_regression_data(LocalStore(path), chunks=chunks, rows=rows, features=features, seed=1)
    if name != "categorical":
        return str(path), regression_formula(features)
    regions = np.array([f"r{j:02d}" for j in range(12)], dtype=object)
    for f in sorted(path.glob("part-*.parquet")):
        pf = pq.ParquetFile(f)
        groups = []
        for g in range(pf.num_row_groups):
            t = pf.read_row_group(g)
            rng = np.random.default_rng(g)
            t = t.append_column("region", pa.array(regions[rng.integers(0, 12, t.num_rows)]))
            groups.append(t)
        with pq.ParquetWriter(f, groups[0].schema) as w:
            for t in groups:
                w.write_table(t, row_group_size=t.num_rows)
    return str(path), CATEGORICAL_FORMULA


def task_workload(name: str, data: str, formula: str, engine: str):
    from pipeline.workloads.regressions import RegressionJob, RegressionWorkload

    _c, _r, _f, cov_type, maxlags, _n = CASES[name]
    job = RegressionJob(data=data, formula=formula, chunk_by="chunk", cov_type=cov_type,
                        maxlags=maxlags, engine=engine)  # fmt: skip
    w = RegressionWorkload(job, f"profile-{name}")
    w.preflight()
    return w


def profile(name: str, engine: str, root: Path, args) -> None:
    from pipeline.storage import LocalStore
    from pipeline.workload import Task

    data, formula = write_data(name, root)
    w = task_workload(name, data, formula, engine)
    n = CASES[name][5]
    store = LocalStore(root / "out")
    task = Task(0, 0, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w.run_task(task, store)  # warm: imports, footers, first-call caches
        walls, cpus = [], []
        for _ in range(args.repeats):  # best of: other processes share the cores
            t0, c0 = time.perf_counter(), time.process_time()
            w.run_task(task, store)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        plain, cpu = min(walls), min(cpus)
        prof = cProfile.Profile()
        prof.enable()
        w.run_task(task, store)
        prof.disable()
    print(f"\n== {name} ({formula}), engine {engine}: one task of {n} chunks: "
          f"{plain:.3f} s unprofiled ({n / plain:,.0f} chunks/s), CPU {cpu:.3f} s "
          f"({n / cpu:,.0f} chunks/s); best of {args.repeats}")  # fmt: skip
    if args.dump:
        Path(args.dump).mkdir(parents=True, exist_ok=True)
        prof.dump_stats(Path(args.dump) / f"{name}-{engine}.pstats")
    for order in ("cumulative", "tottime"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).strip_dirs().sort_stats(order).print_stats(args.top)
        print(s.getvalue().split("\n", 6)[-1].rstrip())
    if args.lines:
        line_profile(w, task, store)


def line_profile(w, task, store) -> None:
    from line_profiler import LineProfiler

    from pipeline.workloads.regressions import (
        design,
        engine,
        fit,
        patsy_fast,
        stack,
        taskfits,
        workload,
    )

    lp = LineProfiler()
    for fn in (
        workload.RegressionWorkload.fit_range,
        workload.RegressionWorkload.tables,
        workload.RegressionWorkload.run_task,
        engine.fit_task,
        engine._fit_stacks,
        stack.solve_stack,
        design.TaskDesign._formula_once,
        patsy_fast.design_once,
        taskfits.TaskFits.models_columns,
        taskfits.TaskFits.coefficient_columns,
        fit.fit_chunk,
        fit._extract,
    ):
        lp.add_function(getattr(fn, "__func__", fn))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lp.runcall(w.run_task, task, store)
    lp.print_stats(output_unit=1e-3, stripzeros=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=[*CASES, "all"], default="all")
    p.add_argument("--engine", choices=["statsmodels", "batched", "auto", "all"], default="all")
    p.add_argument("--top", type=int, default=20, help="Functions listed per ordering.")
    p.add_argument("--repeats", type=int, default=3, help="Unprofiled runs timed (best of).")
    p.add_argument("--dump", default=None, help="Folder for the .pstats files.")
    p.add_argument("--lines", action="store_true", help="Also run line_profiler.")
    p.add_argument("--dir", default=None, help="Scratch folder (default: a temporary one).")
    args = p.parse_args()
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    cases = list(CASES) if args.case == "all" else [args.case]
    engines = ["statsmodels", "auto"] if args.engine == "all" else [args.engine]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for name in cases:
            for engine in engines:
                if engine != "statsmodels" and CASES[name][3] == "HAC":
                    continue  # auto is statsmodels there (the batched engine has no HAC)
                profile(name, engine, Path(tmp) / f"{name}-{engine}", args)


if __name__ == "__main__":
    main()
