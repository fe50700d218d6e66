"""A simulated fleet on one machine: N single-thread Dask workers behind HAProxy.

Starts a scheduler with mutual TLS, HAProxy in front of it with the repository's
configuration (deploy/haproxy/haproxy.cfg), and ``--workers`` real
``distributed.Worker`` objects, ``--per-process`` to a process
(benchmarks/fleet/sim_workers.py), joining through the load balancer with the worker
certificate. Then runs a real ``pipeline run`` through the load balancer with the
client certificate: a ``map`` job over a grid whose function sleeps
``--task-seconds`` (the workers spend no CPU), one unit per task.

It measures: the time until every worker joined; the scheduler's CPU seconds per
worker per second while idle (heartbeats) and per task during the job; tasks per
second and the job's efficiency against the ideal (``ceil(units / workers)`` rounds
of ``--task-seconds``); event-loop stalls and connection errors or timeouts in the
scheduler's, workers', HAProxy's and the driver's logs. Then checks that every unit
is in the results exactly once and that ``pipeline verify`` passes.

    benchmarks/fleet/scale-sim --workers 1000 --per-process 200 --task-seconds 1 --out scale.json

``--kill-worker-process`` SIGKILLs one worker process (``--per-process`` workers)
once a third of the units are done: the job must still complete, nothing lost.

``--memory-limit auto`` gives every simulated worker the memory limit ``dask worker``
sets by default, so each runs distributed's memory monitor (every 100 ms), as a real
fleet's workers do; here they share their process's event loop, which the monitors
starve. The figures then show what the runner's copies of tasks do under that load
(``copies``: made, and the most in flight at once against their bound,
``COPY_SHARE`` of the cluster's threads: docs/scale.md).

    benchmarks/fleet/scale-sim --workers 1000 --per-process 200 --units 8000 \\
        --memory-limit auto --run-timeout 1200 --out monitored.json

``--planned`` lets the planner size the tasks (no ``--units-per-task 1``): units of
``--task-seconds``, ``--ideal-seconds`` of them on every worker; the figures add the
tasks run and the scheduler's share of a core over the command.

    benchmarks/fleet/scale-sim --workers 500 --per-process 100 --planned --task-seconds 0.25 \\
        --out s.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from benchmarks.fleet.scale_logs import copies_in, scan_logs
from benchmarks.fleet.scale_phases import describe_phases, run_phases, tasks_run
from harness.cluster_procs import (
    ENCRYPTION_ENV,
    REPO_ROOT,
    ProcessManager,
    StartupError,
    free_port,
    start_haproxy,
    start_scheduler,
)
from pipeline.cluster.environment import worker_env

#: What a fleet of this size needs of the deployments' environment (pipeline/cluster/
#: worker.env): TLS required, Dask's comm settings, the thread pinning, and the workers'
#: preload (the modules every task uses, imported before the first task as on every
#: deployment; without it each simulated process's first hundred tasks waited for them,
#: 8-10 s each on 500 workers). The simulated workers have no nanny; docs/scale.md.
FLEET_ENV = {
    **ENCRYPTION_ENV,
    **{
        k: v
        for k, v in worker_env().items()
        if k.startswith("DASK_DISTRIBUTED__COMM__")
        or k.endswith("_NUM_THREADS")
        or k == "DASK_DISTRIBUTED__WORKER__PRELOAD"
    },
}

SLEEP_MODULE = '''"""The scale simulation's task: sleeps, so a worker spends no CPU."""

import time


def nap(x, seconds):
    time.sleep(seconds)
    return {"slept": seconds}
'''


def _options(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--per-process", type=int, default=200)
    p.add_argument("--task-seconds", type=float, default=1.0)
    p.add_argument("--units", type=int, default=0, help="units (= tasks); default 4 per worker")
    p.add_argument(
        "--planned",
        action="store_true",
        help="tasks sized by the planner (no --units-per-task 1): units of --task-seconds, "
        "as many as --ideal-seconds on every worker",
    )
    p.add_argument("--ideal-seconds", type=float, default=60.0, help="with --planned")
    p.add_argument(
        "--units-per-task",
        type=int,
        help="with --planned: tasks of this many units, unprobed (the ceiling the fleet "
        "allows a plan known in advance)",
    )
    p.add_argument("--out", type=Path, help="write the figures to this JSON file")
    p.add_argument("--workdir", type=Path, help="default: a new folder under /tmp")
    p.add_argument("--idle-seconds", type=float, default=20.0, help="heartbeat-only window")
    p.add_argument("--join-timeout", type=float, default=300.0)
    p.add_argument("--run-timeout", type=float, default=900.0)
    p.add_argument("--lb-maxconn", type=int, default=8000)
    p.add_argument("--kill-worker-process", action="store_true")
    p.add_argument(
        "--memory-limit",
        default="0",
        help="each simulated worker's memory limit (sim_workers --memory-limit): 0 runs no "
        "memory monitor; auto, as `dask worker` sets it, runs one in every worker",
    )
    return p.parse_args(argv)


def _cpu(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return t.user + t.system + t.children_user + t.children_system


def _fds(pid: int) -> int:
    try:
        return psutil.Process(pid).num_fds()
    except psutil.NoSuchProcess:
        return 0


def _count_workers(client) -> int:
    return len(client.ncores())  # asks the scheduler (scheduler_info may return a stale copy)


def _wait_for_workers(client, n: int, timeout: float, pm: ProcessManager) -> None:
    start = time.monotonic()
    while True:
        seen = _count_workers(client)
        if seen >= n:
            return
        if time.monotonic() - start > timeout:
            raise StartupError(f"{seen} of {n} workers joined in {timeout}s\n{pm.tails(10)}")
        time.sleep(0.5)


def _write_job(workdir: Path, units: int, seconds: float) -> Path:
    (workdir / "simsleep.py").write_text(SLEEP_MODULE)
    job = workdir / "sleep.toml"
    job.write_text(
        'workload = "map"\nfunction = "simsleep:nap"\n'
        f'code = "{workdir / "simsleep.py"}"\n'
        f"[grid]\nx = {{stop = {units}}}\nseconds = [{seconds}]\n"
    )
    return job


def _pipeline(args, env, **kw):
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        **kw,
    )


def _parts_done(output: Path) -> int:
    return sum(1 for _ in output.glob("*/results/part-*.parquet"))


def _units_exactly_once(output: Path, units: int, env) -> dict:
    table = output.parent / "all-results.parquet"
    shown = _pipeline(["results", output, "--out", table], env)
    if shown.returncode != 0:
        return {"ok": False, "error": shown.stderr.strip()[-400:]}
    import pyarrow.parquet as pq

    got = pq.read_table(table, columns=["unit"]).column("unit").to_pylist()
    missing = sorted(set(range(units)) - set(got))
    return {
        "ok": sorted(got) == list(range(units)),
        "rows": len(got),
        "distinct_units": len(set(got)),
        "missing": missing[:10],
    }


def run(opts) -> dict:
    from distributed import Client

    from pipeline.cluster.tls import make_certificates

    n, k = opts.workers, opts.per_process
    per_worker = math.ceil(opts.ideal_seconds / opts.task_seconds) if opts.planned else 4
    units = opts.units or per_worker * n
    workdir = opts.workdir or Path(f"/tmp/scale-sim-{os.getpid()}")
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.update(FLEET_ENV)  # every process started below inherits it
    certs = make_certificates(workdir / "certs")
    figures: dict = {
        "workers": n,
        "per_process": k,
        "task_seconds": opts.task_seconds,
        "units": units,
        "planned": opts.planned,
        "memory_limit": opts.memory_limit,
        "cores": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "settings": dict(FLEET_ENV, LB_MAXCONN=str(opts.lb_maxconn)),
    }
    with ProcessManager(workdir / "logs") as pm:
        scheduler = start_scheduler(pm, certs, port=free_port())
        lb = start_haproxy(
            pm, scheduler.address.removeprefix("tls://"), maxconn=opts.lb_maxconn, timeout=30
        )
        security = _security(certs)
        client = Client(lb.address, security=security, timeout=60)
        procs = []
        t0 = time.monotonic()
        for p in range(math.ceil(n / k)):
            count = min(k, n - p * k)
            procs.append(
                _start_sim_process(pm, lb.address, certs, p, count, workdir, opts.memory_limit)
            )
        _wait_for_workers(client, n, opts.join_timeout, pm)
        figures["join_seconds"] = round(time.monotonic() - t0, 2)
        # Heartbeats only: the scheduler's CPU per worker per second.
        time.sleep(2)
        c0, w0 = _cpu(scheduler.pid), time.monotonic()
        time.sleep(opts.idle_seconds)
        idle_cpu, idle_wall = _cpu(scheduler.pid) - c0, time.monotonic() - w0
        figures["scheduler_idle_cpu_fraction"] = round(idle_cpu / idle_wall, 4)
        figures["scheduler_cpu_per_worker_second"] = idle_cpu / idle_wall / n
        figures["workers_before_job"] = _count_workers(client)
        # Connections a fleet holds open: what file-descriptor limits and maxconn must cover.
        figures["open_fds"] = {"scheduler": _fds(scheduler.pid), "haproxy": _fds(lb.pid)}
        client.close()

        job = _write_job(workdir, units, opts.task_seconds)
        output = workdir / "out"
        driver_flags = [
            "--scheduler", lb.address, "--tls-ca-file", certs["ca"],
            "--tls-cert", certs["client"], "--tls-key", certs["client-key"],
        ]  # fmt: skip
        report = workdir / "report"
        args = ["run", job, "--output", output, "--no-progress", "-v", "--report", report]
        if not opts.planned:
            args += ["--units-per-task", 1]
        elif opts.units_per_task:
            args += ["--units-per-task", opts.units_per_task]
        driver_log = pm.log_dir / "driver.log"
        env = {"PYTHONPATH": str(REPO_ROOT)}
        others = {"haproxy": [lb.pid], "worker_processes": [q for p in procs for q in p.pids()]}
        o0 = {name: sum(_cpu(q) for q in pids) for name, pids in others.items()}
        c0, w0 = _cpu(scheduler.pid), time.monotonic()
        with open(driver_log, "wb") as log:
            driver = subprocess.Popen(
                [sys.executable, "-m", "pipeline", *map(str, args + driver_flags)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
            )
            killed, killed_at = None, None
            driver_cpu = 0.0
            while driver.poll() is None:
                driver_cpu = max(driver_cpu, _cpu(driver.pid))
                if time.monotonic() - w0 > opts.run_timeout:
                    driver.kill()
                    break
                if opts.kill_worker_process and killed is None and _parts_done(output) > units / 3:
                    killed = procs[0]
                    killed_cpu = sum(_cpu(q) for q in killed.pids())
                    killed.kill()
                    killed_at = time.time()
                    others["worker_processes"] = [q for p in procs[1:] for q in p.pids()]
                    o0["worker_processes"] -= killed_cpu
                    figures["killed_worker_process_after_parts"] = _parts_done(output)
                time.sleep(0.2)
        wall = time.monotonic() - w0
        job_cpu = _cpu(scheduler.pid) - c0
        figures["driver_exit_code"] = driver.returncode
        # The command's wall time includes the driver's start (imports, connecting,
        # shipping the code); the run itself is what the driver reports.
        figures["command_seconds"] = round(wall, 2)
        run_seconds = _reported_run_seconds(driver_log)
        figures["run_seconds"] = run_seconds
        ideal = math.ceil(units / n) * opts.task_seconds
        figures["ideal_seconds"] = ideal
        if run_seconds:
            figures["efficiency"] = round(ideal / run_seconds, 3)
            figures["units_per_second"] = round(units / run_seconds, 1)
        figures["driver_cpu_seconds"] = round(driver_cpu, 2)
        for name, pids in others.items():
            used = sum(_cpu(q) for q in pids) - o0[name]
            figures[f"{name}_cpu_seconds_during_command"] = round(used, 2)
        # Per task: all the scheduler's CPU during the command over the tasks (an upper
        # bound: heartbeats included), and net of the heartbeats' rate measured idle
        # (noisy when the idle window is short or the machine loaded).
        heartbeat_cpu = figures["scheduler_cpu_per_worker_second"] * n * wall
        figures["scheduler_job_cpu_seconds"] = round(job_cpu, 2)
        tasks = tasks_run(output) or units
        figures["tasks"] = tasks
        if run_seconds:
            figures["tasks_per_second"] = round(tasks / run_seconds, 1)
        figures["scheduler_cpu_per_task_gross"] = job_cpu / tasks
        figures["scheduler_cpu_per_task"] = max(job_cpu - heartbeat_cpu, 0.0) / tasks
        # The scheduler's share of a core over the command, heartbeats included; net:
        # the tasks' own share, what the planner keeps at or under 25 %.
        figures["scheduler_busy"] = round(job_cpu / wall, 3)
        figures["scheduler_busy_net"] = round(max(job_cpu - heartbeat_cpu, 0.0) / wall, 3)
        figures["scheduler_alive"] = scheduler.alive()
        figures["load_average_at_end"] = os.getloadavg()
        figures.update(run_phases(report, output))
        if run_seconds and "rest_end_seconds" in figures:
            # After the last task: the manifest's consolidation, the run's summary.
            figures["finalization_seconds"] = round(run_seconds - figures["rest_end_seconds"], 2)
        figures["units_exactly_once"] = _units_exactly_once(output, units, env)
        verified = _pipeline(["verify", output], env)
        figures["verify_exit_code"] = verified.returncode
        figures["verify_output"] = verified.stdout.strip()[-300:]
        figures["logs"] = scan_logs(pm.log_dir, killed_at=killed_at)
        figures["copies"] = copies_in(driver_log)
        figures["log_dir"] = str(pm.log_dir)
    return figures


def _reported_run_seconds(driver_log: Path) -> float | None:
    """The run's duration from the driver's summary line: "... 400 of 400 points in 20.07 s"."""
    import re

    found = re.search(r" of [\d,]+ \w+ in ([0-9.]+) s", driver_log.read_text(errors="replace"))
    return float(found.group(1)) if found else None


def _security(certs):
    from distributed.security import Security

    return Security(
        tls_ca_file=str(certs["ca"]),
        tls_client_cert=str(certs["client"]),
        tls_client_key=str(certs["client-key"]),
        require_encryption=True,
    )


def _start_sim_process(pm, address, certs, index, count, workdir, memory_limit="0"):
    argv = [
        sys.executable, "-m", "benchmarks.fleet.sim_workers", address,
        "--count", str(count), "--prefix", f"sim{index}",
        "--ca", str(certs["ca"]), "--cert", str(certs["worker"]), "--key", str(certs["worker-key"]),
        "--local-directory", str(workdir / "scratch" / f"p{index}"),
        "--memory-limit", memory_limit,
    ]  # fmt: skip
    return pm.start(f"workers-{index}", argv)


def main(argv=None) -> int:
    opts = _options(argv)
    figures = run(opts)
    text = json.dumps(figures, indent=2, default=str)
    if opts.out:
        opts.out.write_text(text + "\n")
    print(text)
    print(describe_phases(figures), file=sys.stderr)
    logs, copies = figures["logs"], figures["copies"]
    print(f"copies of tasks: {copies['made']} made, at most {copies['peak_in_flight']} in "
          f"flight at once (bound: {copies['bound']})", file=sys.stderr)  # fmt: skip
    # Killing a worker process closes the scheduler's streams to its workers, which
    # the scheduler logs (lost_worker_streams); anything else is an error.
    ok = (
        figures["workers_before_job"] >= opts.workers
        and figures["driver_exit_code"] == 0
        and figures["verify_exit_code"] == 0
        and figures["units_exactly_once"]["ok"]
        and logs["errors"] == 0
        and copies["peak_in_flight"] <= (copies["bound"] or 0)
    )
    print("OK" if ok else "NOT OK: see the figures above", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
