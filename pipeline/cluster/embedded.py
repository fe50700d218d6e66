"""The embedded cluster: a LocalCluster of single-threaded worker processes on this machine,
started so that scripts, notebooks and interrupted runs behave (see each function)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path

import dask

from ..config import RunOptions
from ..errors import ClusterError, ConfigError
from .environment import process_env

#: Set in every worker process before numpy loads there: the variables of worker.env
#: that native libraries read at a process's start (BLAS threads, glibc's malloc).
WORKER_ENV = process_env()
#: The workers' preloads (as worker.env lists them): the libraries tasks use, then the
#: code every task runs.
WORKER_PRELOADS = ("pipeline.cluster.worker", "pipeline.dispatch")
#: How long a worker of the embedded cluster may be gone from the scheduler before
#: Dask closes its nanny (``distributed.deploy.lost-worker-timeout``, 15 s by default):
#: never, in effect, while the cluster lives (:func:`embedded_cluster`).
LOST_WORKER_TIMEOUT = "365 days"

log = logging.getLogger(__name__)

#: Workers the embedded cluster may start per core of this machine: more than one
#: helps units that wait (downloads), and this many already leaves each a slice.
MAX_WORKERS_PER_CORE = 8


#: Memory an embedded worker process holds once it has imported what tasks use
#: (about 135 MB resident, half of it its own), with a margin.
WORKER_PROCESS_BYTES = 150 << 20


def check_embedded_workers(options: RunOptions) -> None:
    """Refuse a worker count this machine cannot hold, before any process starts: the
    embedded cluster makes every worker a process here, and a count meant for a fleet
    would otherwise start them all and fail minutes later."""
    import psutil

    if options.scheduler or not options.workers:
        return
    cores = len(os.sched_getaffinity(0))
    available = psutil.virtual_memory().available
    most = min(MAX_WORKERS_PER_CORE * cores, max(1, available // WORKER_PROCESS_BYTES))
    if options.workers > most:
        raise ConfigError(
            f"workers = {options.workers} (--workers, PIPELINE_WORKERS): the embedded "
            f"cluster starts each worker as a process on this machine ({cores} cores, "
            f"{available / 2**30:.1f} GiB available, about {WORKER_PROCESS_BYTES >> 20} MB "
            f"a worker), at most {most} here. To run on a cluster, give --scheduler; to "
            "project a job on a fleet, pipeline estimate --fleet c5.24xlarge:10"
        )


def spawn_without_rerunning_main() -> None:
    """Let a script start worker processes from its top level.

    Worker processes are spawned, and a spawned process imports the main script
    again: a script that starts the cluster outside ``if __name__ == "__main__":``
    would start it again in every worker, which then fails with some 60 lines of
    multiprocessing tracebacks. Found here, before any process starts, from the
    script's source and the line of its top level that led to this call; the main
    module is then named ``__main__`` for spawn, which does not import a main of
    that name again (as with ``python -m pkg``): the workers get the script's
    functions by value, as from ``python -c`` or a notebook.
    """
    import ast
    import importlib.machinery

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not path.endswith(".py") or getattr(main, "__spec__", None) is not None:
        return  # an interactive session, a notebook, python -c, or python -m (spawn imports
        # a module by name, and a package's __main__ is not re-run)
    frame = sys._getframe()
    while frame is not None and not (
        frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None:
        return
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    except (OSError, SyntaxError, ValueError):
        return
    guarded = [
        range(node.lineno, node.end_lineno + 1)
        for node in tree.body
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
        and "__name__" in ast.unparse(node.test)
    ]  # fmt: skip
    if not any(frame.f_lineno in lines for lines in guarded):
        main.__spec__ = importlib.machinery.ModuleSpec("__main__", None, origin=path)


def _refuse_inside_a_worker() -> None:
    """A task that runs a job (``pipeline.map`` inside a map function) or imports a
    script whose top level does would start a cluster in every worker it runs on."""
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:
        return
    raise ClusterError(
        f"a task on Dask worker {worker.address} would start an embedded cluster inside "
        "the worker (a job run by the task, or by the top level of a module it imports): "
        "give that run client= a cluster, or put a module's script code under "
        '`if __name__ == "__main__":`'
    )


def _forget_main_without_a_file() -> None:
    """A script read from standard input (``python - <<EOF``) runs as a ``__main__``
    whose ``__file__`` is ``<stdin>``: each spawned worker would try to run that file
    again and fail to start. Like ``python -c``'s, such a main has no file to re-run;
    without the pseudo-path, spawn leaves it alone (functions defined in it travel by
    value)."""

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if isinstance(path, str) and path.startswith("<") and getattr(main, "__spec__", None) is None:
        del main.__file__


def _quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker with its leak warning off.

    The tracker outlives a driver killed with SIGKILL and removes the semaphores the
    cluster's processes used, which is its job; but it also prints a "leaked
    semaphore objects" warning that reads like a fault of ours. Its warnings filter
    comes from the environment it starts with.
    """
    from multiprocessing import resource_tracker

    before = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(
        filter(None, [before, "ignore:resource_tracker:UserWarning"])
    )
    try:
        resource_tracker.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before


#: A semaphore file older than this, which no process maps, is a dead run's.
STALE_SEMAPHORE_SECONDS = 60.0


def sweep_stale_semaphores(shm: Path = Path("/dev/shm"), min_age=STALE_SEMAPHORE_SECONDS) -> int:
    """Remove multiprocessing's named semaphores (``sem.mp-*``) left by an earlier run
    killed whole with SIGKILL (a container stop, ``kill -9`` of its process group): the
    resource tracker that removes them died with it. One in use is mapped by a live
    process; the files are this user's alone (mode 0600). Returns how many went."""
    now, uid = time.time(), os.getuid()
    candidates = {}
    for path in shm.glob("sem.mp-*"):
        with contextlib.suppress(OSError):
            st = path.stat()
            if st.st_uid == uid and now - st.st_mtime > min_age:
                candidates[path] = st.st_ino
    if not candidates:
        return 0
    # By inode: glibc maps a semaphore under a temporary name, then links it to its own.
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            for line in maps.read_text().splitlines():
                if f"{shm}/sem." in line:
                    mapped.add(int(line.split()[4]))
    removed = 0
    for path, inode in candidates.items():
        if inode not in mapped:
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed


@contextlib.contextmanager
def embedded_cluster(n_workers: int, quiet: bool, dashboard: bool = False, profile: bool = False):
    """``profile``: Dask's statistical profiler on the workers, for the performance
    report and the dashboard. It samples each worker's stack every 10 ms, taking the
    GIL from the task (a few percent of its time): off unless asked for."""
    from distributed import LocalCluster

    _refuse_inside_a_worker()
    spawn_without_rerunning_main()
    _forget_main_without_a_file()
    _quiet_resource_tracker()
    sweep_stale_semaphores()
    # The nanny sets pre-spawn-environ in the parent before it spawns the worker
    # process, so the variables are there before the worker imports numpy.
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **WORKER_ENV}
    preload = [*dask.config.get("distributed.worker.preload", []), *WORKER_PRELOADS]
    settings = {
        "distributed.nanny.pre-spawn-environ": environ,
        "distributed.worker.daemon": False,
        "distributed.worker.preload": preload,
        "pipeline.embedded-worker": True,  # see pipeline.cluster.worker
        "distributed.worker.profile.enabled": profile,
        # The embedded cluster shares the driver's cores: Dask's event-loop tick (by
        # default every 20 ms in the scheduler, each nanny and each worker) and system
        # monitors (every 0.5 s) would keep an idle cluster at several percent of a core
        # per process; these cut that to about a third. A tick still catches a loop
        # blocked for longer than its limit (3 s).
        "distributed.admin.tick.interval": "500ms",
    }
    if not (dashboard or profile):  # their plots are drawn from the system monitor
        settings["distributed.admin.system-monitor.interval"] = "5s"
    with dask.config.set(settings):
        try:
            cluster = LocalCluster(
                n_workers=n_workers,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                # The HTTP server (/health) always, on a free loopback port; Bokeh's
                # dashboard on it only when asked: 0.7 s of a 2 s start.
                dashboard_address="127.0.0.1:0",
                scheduler_kwargs={"dashboard": dashboard},
                silence_logs=logging.ERROR if quiet else logging.WARNING,
            )
        except Exception as exc:
            raise ClusterError(
                f"cannot start the embedded cluster of {n_workers} workers: {exc}"
            ) from exc
    try:
        # Dask closes a worker's nanny for good when the worker has been gone from the
        # scheduler for this long (read at each loss) at the moment it looks: a unit
        # that ends its worker process again and again left it gone at that moment,
        # and the cluster with no worker. The nannies here live in this process and
        # restart their workers: no worker of theirs is lost for that long.
        with dask.config.set({"distributed.deploy.lost-worker-timeout": LOST_WORKER_TIMEOUT}):
            yield cluster
    finally:
        _close_embedded(cluster)


def _close_embedded(cluster) -> None:
    """Close the embedded cluster; a failure to is logged, never raised. A worker whose
    process a unit's code ended just before is being restarted by its nanny, and a
    close then can fail in Dask ("can only join a started process"): the run is over
    and its results stored, so a second try, then a warning. The same failure can
    also leave Dask's close waiting for good (its error raised in a callback): each
    try is bounded."""
    error = None
    for _attempt in range(2):
        try:
            cluster.close(timeout=CLOSE_SECONDS)
            return
        except Exception as exc:
            error = exc
            time.sleep(0.5)
    log.warning("the embedded cluster did not close cleanly: %s: %s", type(error).__name__, error)


#: Seconds one try at closing the embedded cluster may take (it takes about 2).
CLOSE_SECONDS = 20
