"""Backup copies of slow tasks: a job's wall time with one slow worker, against the same
job with none, and the work backups add when no worker is slow.

A cluster of ``--workers`` single-thread Dask workers in one process of its own (a
``LocalCluster`` without worker processes: the tasks sleep, so this 2-core VM can
host it), and a ``pipeline.map`` job of ``--tasks`` units, one a task, whose
function sleeps ``--task-seconds``, ``--slow-factor`` times longer on one worker
(chosen by its Dask name). Each call of the function appends a line to a log, so
the attempts (first runs, backups, copies) are counted. Three runs on the same
cluster, in turn: no slow worker; one slow worker; one slow worker with the
backups turned off (the runner as it was before them: its only copies, of lost
tasks, come after 60 s of a run's tail). Prints a JSON line per run and one with
the ratios:

    python -m benchmarks.bench_backups                      # 16 workers, 400 x 1 s, 10x
    python -m benchmarks.bench_backups --workers 8 --tasks 160 --task-seconds 0.5

Bars (issue 47): with 16 workers, 400 tasks of 1 s, one 10x slower, the slow run
takes at most 1.15 x the run with no slow worker (the floor is 1.06: the slow
worker is 5.6 % of the capacity); with no slow worker, attempts exceed units by at
most 3 %.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def nap(i, seconds, factor, slow_worker, log):
    """One unit: sleep ``seconds`` (``factor`` times as long on worker ``slow_worker``),
    logging the call."""
    from distributed import get_worker

    name = str(get_worker().name)
    with open(log, "a") as f:
        f.write(f"{i} {name}\n")
    time.sleep(seconds * (factor if name == slow_worker else 1.0))
    return {"i": i}


def serve_cluster(workers: int) -> None:
    """Child: a cluster of ``workers`` single-thread workers in this process; its
    address on stdout; runs until stdin closes."""
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                           dashboard_address=None, memory_limit=0, protocol="tcp://",
                           host="127.0.0.1")  # fmt: skip
    print(cluster.scheduler_address, flush=True)
    sys.stdin.read()
    cluster.close()


def run_case(client, args, out: Path, name: str, slow_worker: str, backups: bool) -> dict:
    import math

    import pipeline
    from pipeline.dispatch import stragglers

    saved = stragglers.BACKUP_AFTER_DONE
    stragglers.BACKUP_AFTER_DONE = saved if backups else math.inf
    log = out / f"{name}.calls"
    log.touch()
    grid = {"i": list(range(args.tasks)), "seconds": [args.task_seconds],
            "factor": [args.slow_factor], "slow_worker": [slow_worker],
            "log": [str(log)]}  # fmt: skip
    t0 = time.perf_counter()
    try:
        summary = pipeline.map(nap, client=client, grid=grid, output=str(out / name),
                               units_per_task=1, progress=False)  # fmt: skip
    finally:
        stragglers.BACKUP_AFTER_DONE = saved
    wall = time.perf_counter() - t0
    calls = log.read_text().splitlines()
    done = {int(line.split()[0]) for line in calls}
    assert summary.complete and done == set(range(args.tasks)), (summary, len(done))
    on_slow = sum(1 for line in calls if line.split()[1] == slow_worker)
    return {"case": name, "wall_seconds": round(wall, 2), "units": args.tasks,
            "attempts": len(calls), "extra_attempts": len(calls) - args.tasks,
            "on_slow_worker": on_slow}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--tasks", type=int, default=400)
    p.add_argument("--task-seconds", type=float, default=1.0)
    p.add_argument("--slow-factor", type=float, default=10.0)
    p.add_argument("--serve-cluster", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_cluster:
        serve_cluster(args.serve_cluster)
        return
    from distributed import Client

    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_backups", "--serve-cluster", str(args.workers)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    try:
        address = child.stdout.readline().strip()
        with tempfile.TemporaryDirectory() as tmp, Client(address) as client:
            client.wait_for_workers(args.workers, timeout=120)
            slow = "0"
            run_case(client, args, Path(tmp), "warm-up", "", True)  # the cluster's first job
            rows = []
            for name, slow_worker, backups in [
                ("no-slow-worker", "", True),
                ("one-slow-worker", slow, True),
                ("one-slow-worker-no-backups", slow, False),
            ]:
                rows.append(run_case(client, args, Path(tmp), name, slow_worker, backups))
                print(json.dumps(rows[-1]), flush=True)
                time.sleep(args.task_seconds * args.slow_factor)  # the slow worker's last
        base = rows[0]["wall_seconds"]
        print(json.dumps({
            "workers": args.workers, "tasks": args.tasks, "task_seconds": args.task_seconds,
            "slow_factor": args.slow_factor,
            "slow_over_none": round(rows[1]["wall_seconds"] / base, 3),
            "slow_over_none_without_backups": round(rows[2]["wall_seconds"] / base, 3),
            "extra_work_without_slow_worker": round(rows[0]["extra_attempts"] / args.tasks, 4),
            "floor": round(args.workers / (args.workers - 1 + 1 / args.slow_factor), 3),
        }), flush=True)  # fmt: skip
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()


if __name__ == "__main__":
    main()
