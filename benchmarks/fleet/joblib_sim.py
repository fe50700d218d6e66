"""A joblib ``Parallel`` call on a simulated fleet (issue 45.3): N single-thread Dask
workers behind HAProxy with mutual TLS (the fleet of :mod:`.scale_sim`), and a driver
program that runs ``Parallel(n_jobs=-1)`` of ``--calls`` calls that each sleep
``--call-seconds``, through the load balancer, on the ``pipeline`` backend or on
joblib's own Dask backend (``--joblib dask``, a ``Client`` made as its users make it).

It measures the driver's wall time (against the ideal, ``ceil(calls / workers)`` rounds
of ``--call-seconds``), the scheduler's CPU seconds per call (net of the heartbeats'
rate measured idle; from the driver's start, and of its ``Parallel`` call alone, the
connection apart), and checks that every call returned its result in order and ran
once (each call leaves a file; calls run twice are counted). A hang is reported as
such once ``--run-timeout`` passes.

    benchmarks/fleet/joblib-sim --workers 1000 --calls 8000 --joblib pipeline --out p.json
    benchmarks/fleet/joblib-sim --workers 1000 --calls 8000 --joblib dask --out d.json

Bars (issue 45.3, pipeline): every call once, scheduler CPU <= 1 ms per call (the
figure from the driver's start, connection included); the dask run is reported side
by side (hang, time or failure, as it comes). ``--profile-scheduler FILE`` samples the
scheduler with py-spy (``pip install py-spy``) while it holds the GIL during the call.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.fleet.scale_sim import (
    FLEET_ENV,
    _count_workers,
    _cpu,
    _security,
    _start_sim_process,
    _wait_for_workers,
)
from harness.cluster_procs import (
    REPO_ROOT,
    ProcessManager,
    free_port,
    start_haproxy,
    start_scheduler,
)

DRIVER = """
import json, os, sys, time
import joblib
from joblib import Parallel, delayed

address, ca, cert, key, calls, seconds, marks, backend = sys.argv[1:9]
calls, seconds = int(calls), float(seconds)

def call(i, seconds, marks):
    open(os.path.join(marks, f"{i}-{os.getpid()}-{time.monotonic_ns()}"), "w").close()
    time.sleep(seconds)
    return i

t0 = time.monotonic()
if backend == "pipeline":
    import pipeline  # noqa: F401
    config = joblib.parallel_config(backend="pipeline", scheduler=address, tls_ca_file=ca,
                                    tls_cert=cert, tls_key=key)
else:
    from distributed import Client
    from distributed.security import Security
    client = Client(address, security=Security(tls_ca_file=ca, tls_client_cert=cert,
                    tls_client_key=key, require_encryption=True), timeout=60)
    config = joblib.parallel_backend("dask", client=client)
with config:
    workers = joblib.effective_n_jobs(-1)  # (connected, the session open: timed apart)
    open(os.path.join(os.path.dirname(marks), "parallel-started"), "w").close()
    started = time.monotonic()
    out = Parallel(n_jobs=-1)(delayed(call)(i, seconds, marks) for i in range(calls))
    ended = time.monotonic()
    open(os.path.join(os.path.dirname(marks), "parallel-ended"), "w").close()
print(json.dumps({"in_order": out == list(range(calls)), "results": len(out), "n_jobs": workers,
                  "connect_seconds": started - t0, "parallel_seconds": ended - started}))
"""


def _options(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--per-process", type=int, default=200)
    p.add_argument("--calls", type=int, default=8000)
    p.add_argument("--call-seconds", type=float, default=2.0)
    p.add_argument("--joblib", choices=("pipeline", "dask"), default="pipeline")
    p.add_argument("--out", type=Path, help="write the figures to this JSON file")
    p.add_argument("--workdir", type=Path, help="default: a new folder under /tmp")
    p.add_argument("--idle-seconds", type=float, default=20.0, help="heartbeat-only window")
    p.add_argument("--join-timeout", type=float, default=300.0)
    p.add_argument("--run-timeout", type=float, default=900.0)
    p.add_argument("--lb-maxconn", type=int, default=8000)
    p.add_argument(
        "--profile-scheduler",
        type=Path,
        metavar="FILE",
        help="sample the scheduler with py-spy during the call (collapsed stacks)",
    )
    return p.parse_args(argv)


def run(opts) -> dict:
    from distributed import Client

    from pipeline.cluster.tls import make_certificates

    n = opts.workers
    workdir = opts.workdir or Path(f"/tmp/joblib-sim-{os.getpid()}")
    marks = workdir / "marks"
    marks.mkdir(parents=True, exist_ok=True)
    os.environ.update(FLEET_ENV)
    certs = make_certificates(workdir / "certs")
    figures: dict = {"backend": opts.joblib, "workers": n, "calls": opts.calls,
                     "call_seconds": opts.call_seconds, "cores": os.cpu_count(),
                     "load_average_at_start": os.getloadavg()}  # fmt: skip
    with ProcessManager(workdir / "logs") as pm:
        scheduler = start_scheduler(pm, certs, port=free_port())
        lb = start_haproxy(
            pm, scheduler.address.removeprefix("tls://"), maxconn=opts.lb_maxconn, timeout=30
        )
        client = Client(lb.address, security=_security(certs), timeout=60)
        t0 = time.monotonic()
        for p in range(math.ceil(n / opts.per_process)):
            count = min(opts.per_process, n - p * opts.per_process)
            _start_sim_process(pm, lb.address, certs, p, count, workdir)
        _wait_for_workers(client, n, opts.join_timeout, pm)
        figures["join_seconds"] = round(time.monotonic() - t0, 2)
        time.sleep(2)
        c0, w0 = _cpu(scheduler.pid), time.monotonic()
        time.sleep(opts.idle_seconds)
        idle_rate = (_cpu(scheduler.pid) - c0) / (time.monotonic() - w0)
        figures["workers_before_call"] = _count_workers(client)
        client.close()

        script = workdir / "driver.py"
        script.write_text(DRIVER)
        argv = [sys.executable, str(script), lb.address, certs["ca"], certs["client"],
                certs["client-key"], opts.calls, opts.call_seconds, marks, opts.joblib]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        spy = _start_py_spy(scheduler.pid, opts.profile_scheduler)
        c0, w0 = _cpu(scheduler.pid), time.monotonic()
        call = _run_driver(argv, env, workdir, scheduler.pid, opts.run_timeout)
        wall = time.monotonic() - w0
        used = _cpu(scheduler.pid) - c0
        _stop_py_spy(spy)
        figures.update(call.pop("figures"))
        figures["command_seconds"] = round(wall, 2)
        figures["ideal_seconds"] = math.ceil(opts.calls / n) * opts.call_seconds
        if figures.get("parallel_seconds"):
            figures["efficiency"] = round(figures["ideal_seconds"] / figures["parallel_seconds"], 3)
        figures["scheduler_cpu_per_call_gross"] = used / opts.calls
        figures["scheduler_cpu_per_call"] = max(used - idle_rate * wall, 0.0) / opts.calls
        if "parallel_cpu" in call:  # the Parallel call alone, the driver's connection apart
            net = call["parallel_cpu"] - idle_rate * call["parallel_wall"]
            figures["scheduler_cpu_per_call_parallel_only"] = max(net, 0.0) / opts.calls
        runs = collections.Counter(int(m.name.split("-")[0]) for m in marks.iterdir())
        figures["calls_run"] = len(runs)
        figures["calls_run_more_than_once"] = sum(1 for c in runs.values() if c > 1)
        figures["every_call_once"] = set(runs) == set(range(opts.calls)) and all(
            c == 1 for c in runs.values()
        )
        figures["scheduler_alive"] = scheduler.alive()
        figures["log_dir"] = str(pm.log_dir)
    return figures


def _run_driver(argv, env, workdir: Path, scheduler_pid: int, timeout: float) -> dict:
    """Run the driver program; its figures, and the scheduler's CPU seconds and the
    wall seconds of its Parallel call alone (between the marks the driver leaves)."""
    started_mark, ended_mark = workdir / "parallel-started", workdir / "parallel-ended"
    out_path, err_path = workdir / "driver.out", workdir / "driver.err"
    figures: dict = {}
    marks: dict[str, tuple[float, float]] = {}
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(list(map(str, argv)), stdout=out, stderr=err, env=env)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            for name, path in (("started", started_mark), ("ended", ended_mark)):
                if name not in marks and path.exists():
                    marks[name] = (_cpu(scheduler_pid), time.monotonic())
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            figures["outcome"] = f"hang: no result after {timeout:.0f} s"
        else:
            rc = proc.returncode
            figures["outcome"] = "exit 0" if rc == 0 else f"exit {rc}"
            lines = out_path.read_text().strip().splitlines()
            figures.update(json.loads(lines[-1]) if rc == 0 and lines else {})
    figures["driver_stderr_tail"] = err_path.read_text().strip()[-1500:]
    call: dict = {"figures": figures}
    if "started" in marks and "ended" in marks:
        call["parallel_cpu"] = marks["ended"][0] - marks["started"][0]
        call["parallel_wall"] = marks["ended"][1] - marks["started"][1]
    return call


def _start_py_spy(pid: int, out: Path | None):
    """py-spy sampling process ``pid`` into ``out`` (collapsed stacks), or None."""
    if out is None:
        return None
    spy = Path(sys.executable).with_name("py-spy")
    argv = [str(spy if spy.exists() else "py-spy"), "record", "--pid", str(pid), "--format",
            "raw", "--rate", "100", "--gil", "--nonblocking", "--output", str(out)]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop_py_spy(spy) -> None:
    """Stop sampling; py-spy writes its file as it ends on SIGINT."""
    if spy is None:
        return
    import signal

    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout=60)
    except subprocess.TimeoutExpired:
        spy.kill()


def main(argv=None) -> int:
    opts = _options(argv)
    figures = run(opts)
    text = json.dumps(figures, indent=2, default=str)
    if opts.out:
        opts.out.write_text(text + "\n")
    print(text)
    ok = (
        figures.get("outcome") == "exit 0"
        and figures.get("in_order")
        and figures["every_call_once"]
        and figures["scheduler_cpu_per_call"] <= 0.001
    )
    print("OK" if ok else "NOT OK: see the figures above", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
