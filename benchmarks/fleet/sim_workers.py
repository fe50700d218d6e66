"""Many real ``distributed.Worker`` objects in one process: a simulated fleet.

Each worker is a real Dask worker (one thread, mutual TLS with the worker
certificate) that registers with the scheduler address it is given (the load
balancer), heartbeats, and runs tasks. Tasks that sleep need no core, so a
2-core machine can hold hundreds of them. What is *not* simulated: each
worker's own process (here ``--count`` workers share one event loop and one
GIL), the memory monitor (``memory_limit=0``, unless ``--memory-limit`` gives one:
``auto`` is what ``dask worker`` sets by default, and then every worker checks the
process's memory every 100 ms, as a fleet's workers do, on the one event loop they
share here), the statistical profiler (off), the 20 ms event-loop tick measurement
(every 500 ms) and the 500 ms system monitor (every 10 s): per-worker costs that
never reach the scheduler.

A worker whose scheduler connection breaks closes itself (Dask workers do not
reconnect), and when closing takes over 30 s Dask ends its whole process
(``os._exit``). So this process is a supervisor: it runs the workers in a child
process, starts a closed worker again after ``--restart-seconds`` (as a nanny
would), and starts the child again when it exits (as ``Restart=always`` of the
Terraform module's systemd unit, or Compose's ``restart: unless-stopped``,
restarts a ``dask worker`` container). A new worker keeps trying to reach the
scheduler for ``--death-timeout`` seconds. SIGKILL to the process group ends both.

    python -m benchmarks.fleet.sim_workers tls://127.0.0.1:8786 --count 200 --prefix p0 \\
        --ca ca.pem --cert worker.pem --key worker-key.pem --local-directory /tmp/w
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

log = logging.getLogger("sim_workers")


def _options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "scheduler", help="address of the scheduler (the load balancer), tls://HOST:PORT"
    )
    p.add_argument("--count", type=int, required=True, help="workers in this process")
    p.add_argument("--prefix", required=True, help="worker names are PREFIX-0 .. PREFIX-<count-1>")
    p.add_argument("--ca", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--local-directory", required=True)
    p.add_argument("--host", default="127.0.0.1", help="address the workers listen on")
    p.add_argument("--start-concurrency", type=int, default=50, help="workers starting at once")
    p.add_argument("--restart-seconds", type=float, default=2.0)
    p.add_argument("--death-timeout", type=float, default=120.0)
    p.add_argument(
        "--memory-limit",
        default="0",
        help="each worker's memory limit, as `dask worker --memory-limit` takes it: 0 (the "
        "default) runs no memory monitor; auto (dask worker's default) or a size runs it",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


async def _keep_running(name: str, opts, security, gate: asyncio.Semaphore, stop: asyncio.Event):
    """Start worker ``name``; start it again whenever it closes, until ``stop``."""
    from distributed import Worker

    first = True
    while not stop.is_set():
        if not first:
            await asyncio.sleep(opts.restart_seconds)
        first = False
        worker = Worker(
            opts.scheduler,
            nthreads=1,
            name=name,
            host=opts.host,
            security=security,
            memory_limit=_memory_limit(opts.memory_limit),
            local_directory=opts.local_directory,
            death_timeout=opts.death_timeout,
        )
        try:
            async with gate:
                await worker  # registers with the scheduler
        except Exception as exc:  # scheduler unreachable for death_timeout: try again
            log.warning("worker %s did not start (%r); starting it again", name, exc)
            await worker.close(reason="sim-start-failed")
            continue
        closed = asyncio.ensure_future(worker.finished())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([closed, stopping], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            closed.cancel()
            await worker.close(reason="sim-stopped")
            return
        stopping.cancel()
        log.warning("worker %s closed; starting it again in %s s", name, opts.restart_seconds)


def _memory_limit(text: str) -> int | str:
    """``--memory-limit`` as ``distributed.Worker`` takes it: 0 (no monitor), a number of
    bytes, or a string it parses (``auto``, ``4GiB``, a fraction of the memory)."""
    return int(text) if text.isdigit() else text


async def _main(opts) -> None:
    import dask
    from distributed.security import Security

    # Per-worker periodic work that never reaches the scheduler, made rarer: with
    # hundreds of workers on one event loop, each one's 20 ms event-loop tick
    # measurement alone is thousands of callbacks a second (stalls over 3 s are
    # still logged); and each one's system monitor reads this one process's CPU,
    # memory, network, disk and open files (hundreds here: every worker's connections)
    # twice a second, half the process's CPU at 100 workers. Heartbeats still go at
    # the scheduler's rate, with the monitor's last reading.
    dask.config.set(
        {
            "distributed.worker.profile.enabled": False,
            "distributed.admin.tick.interval": "500ms",
            "distributed.admin.system-monitor.interval": "10s",
        }
    )
    security = Security(
        tls_ca_file=opts.ca,
        tls_worker_cert=opts.cert,
        tls_worker_key=opts.key,
        require_encryption=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gate = asyncio.Semaphore(opts.start_concurrency)
    names = [f"{opts.prefix}-{i}" for i in range(opts.count)]
    await asyncio.gather(*(_keep_running(n, opts, security, gate, stop) for n in names))


def _supervise(opts, argv: list[str]) -> int:
    """Run the workers' process; start it again whenever it exits, until SIGTERM."""
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum, _frame):
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        child = subprocess.Popen([sys.executable, __file__, *argv, "--child"])
        code = child.wait()
        if not stopping:
            log.warning("workers' process exited (%s); starting it again", code)
            time.sleep(opts.restart_seconds)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    opts = _options(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    os.makedirs(opts.local_directory, exist_ok=True)
    if not opts.child:
        return _supervise(opts, argv)
    asyncio.run(_main(opts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
