"""Connecting to a Dask cluster: an embedded ``LocalCluster`` or an existing scheduler."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dask

from ..config import RunOptions
from ..errors import ClusterError, ConfigError

__all__ = ["WORKER_ENV", "connect"]

#: Set in every worker process before numpy loads there. One task per worker
#: thread, and BLAS must not start its own threads on top of that. glibc's heap
#: kept for arrays under 32 MiB, trimmed above 64 MiB: Dask's nanny sets
#: MALLOC_TRIM_THRESHOLD_=65536, which also fixes glibc's mmap threshold at 128 KiB,
#: so every array over that was a fresh mapping, its pages faulted in again by each
#: use: regression tasks of 2,500 chunks took 0.38-0.40 s with it, 0.25-0.26 s
#: with these (median of 16 tasks, 2 workers).
WORKER_ENV = {
    "MKL_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MALLOC_TRIM_THRESHOLD_": str(64 << 20),
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
}

log = logging.getLogger(__name__)

#: How long closing the client may take when the run already failed.
CLOSE_AFTER_ERROR_SECONDS = 5


@contextlib.contextmanager
def connect(options: RunOptions, *, quiet: bool = True) -> Iterator:
    """Yield a ``distributed.Client``: to ``options.scheduler`` if set, else to a new
    embedded cluster of single-threaded worker processes that is closed on exit.

    A remote scheduler is usually behind a load balancer that forwards only the
    scheduler's port, so the client gets results through the scheduler
    (``direct_to_workers=False``) unless ``--direct-to-workers`` says the driver
    can reach every worker's own address.
    """
    from distributed import Client

    if options.scheduler:
        address = options.scheduler
        _require_tls_beyond_loopback(address)
        security = _security(options)
        if security is not None and "://" not in address:
            address = f"tls://{address}"  # TLS settings given: a bare address means TLS
        if security is not None and not address.startswith("tls://"):
            raise ClusterError(
                f"--scheduler {address}: the TLS settings are given, and a TLS scheduler's "
                f"address is tls://{address.split('://', 1)[-1]}"
            )
        if security is None and address.startswith("tls://") and not _dask_tls_configured():
            raise ClusterError(
                f"--scheduler {address}: TLS needs --tls-ca-file, --tls-cert and --tls-key "
                "(or PIPELINE_TLS_CA_FILE, PIPELINE_TLS_CERT, PIPELINE_TLS_KEY); `pipeline "
                "certs` makes a set"
            )
        try:
            client = Client(
                address,
                security=security,
                timeout="30s",
                set_as_default=True,
                direct_to_workers=bool(options.direct_to_workers),
            )
        except (OSError, TimeoutError, ValueError, RuntimeError) as exc:
            raise ClusterError(
                f"cannot reach the Dask scheduler at {address} "
                f"(--scheduler / PIPELINE_SCHEDULER): {exc}"
            ) from exc
        with _closing(client):
            try:
                yield client
            except ClusterError:
                # The scheduler was lost mid-run and the client is still trying to
                # reconnect; closing it cancels that, which distributed logs as an
                # error with a traceback. The ClusterError already says what happened.
                logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
                raise
        return

    if options.tls_cert or options.tls_key or options.tls_ca_file:
        log.info("TLS settings are ignored by the embedded cluster (it listens on loopback)")
    check_embedded_workers(options)
    with (
        _embedded_cluster(
            options.workers or os.cpu_count() or 1,
            quiet,
            options.dashboard,
            profile=bool(options.report or options.dashboard),
        ) as cluster,
        _closing(Client(cluster, set_as_default=True)) as client,
    ):
        client.run(_quiet_closing)
        yield client


class _ClosingNoise(logging.Filter):
    """Drops the error, with two tracebacks, that an embedded cluster's worker logs when
    its last heartbeat is in flight as the driver closes the cluster (scheduler too):
    nothing is wrong, and on a run stopped by bad input found while the cluster
    started, it buried the one line that mattered (one run in five)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(
            "Failed to communicate with scheduler during heartbeat"
        )


def _quiet_closing() -> None:
    """Worker of the embedded cluster (on a fleet the same message says the scheduler
    was lost, which its operators want to see)."""
    worker_log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, _ClosingNoise) for f in worker_log.filters):
        worker_log.addFilter(_ClosingNoise())


@contextlib.contextmanager
def _closing(client):
    """Close ``client`` on exit. Not ``with client``: that sets a context variable,
    which only the thread that set it may reset (:class:`ClusterStart` connects in
    one thread and closes in another)."""
    try:
        yield client
    except BaseException:
        # The run's own error says what happened. Closing must neither replace it nor
        # wait long on a scheduler that is gone (a client reconnecting through a load
        # balancer took 60 s to close and raised TimeoutError in its place).
        with contextlib.suppress(Exception):
            client.close(timeout=CLOSE_AFTER_ERROR_SECONDS)
        raise
    client.close()


#: Workers the embedded cluster may start per core of this machine: more than one
#: helps units that wait (downloads), and this many already leaves each a slice.
MAX_WORKERS_PER_CORE = 8
#: Memory an embedded worker process holds once it has imported what tasks use
#: (measured: 133 MB resident, 78 MB of it its own).
WORKER_PROCESS_BYTES = 150 << 20


def check_embedded_workers(options: RunOptions) -> None:
    """Refuse a worker count this machine cannot hold, before any process starts: the
    embedded cluster makes every worker a process here (``--workers 960`` meant for a
    fleet started 960 on 2 cores, and failed minutes later)."""
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


class ClusterStart:
    """:func:`connect` begun in a thread, so that the cluster starts (and its workers
    import ``modules`` and open the stores at ``urls``) while the driver validates its
    inputs. :meth:`client` waits for it; leaving the ``with`` block closes it,
    whatever happened meanwhile."""

    def __init__(
        self, options: RunOptions, modules: tuple[str, ...] = (), urls: tuple[str, ...] = ()
    ):
        check_embedded_workers(options)  # at once, not after the inputs are checked
        if not options.scheduler:
            _spawn_without_rerunning_main()  # it inspects the caller's frames: this thread's
        self._stack = contextlib.ExitStack()
        self._client = None
        self._error: BaseException | None = None
        #: Seconds the start took, and of them the workers' imports.
        self.seconds = self.import_seconds = 0.0
        self._thread = threading.Thread(
            target=self._start, args=(options, modules, urls), name="pipeline-cluster-start"
        )
        self._thread.start()

    def _start(self, options: RunOptions, modules: tuple[str, ...], urls: tuple[str, ...]) -> None:
        t0 = time.perf_counter()
        try:
            client = self._stack.enter_context(connect(options))
            t1 = time.perf_counter()
            if (modules or urls) and not options.scheduler:  # a fleet's workers live on
                client.run(prepare_worker, list(modules), list(urls))
            self.import_seconds = time.perf_counter() - t1
            self._client = client
        except BaseException as exc:  # raised in the driver's thread by client()
            self._error = exc
        self.seconds = time.perf_counter() - t0

    def client(self):
        """The connected client, once the start is done (its error if it failed)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._client

    def close(self) -> None:
        """Close it once started (it is not needed, or the inputs were bad)."""
        self.__exit__(None, None, None)

    def __enter__(self) -> ClusterStart:
        return self

    def __exit__(self, *exc_info) -> bool:
        self._thread.join()
        return bool(self._stack.__exit__(*exc_info))


def prepare_worker(modules: list[str], urls: list[str]) -> None:
    """Worker: import ``modules`` and open the stores at ``urls`` (what fails is for
    the tasks to report)."""
    for name in modules:
        if name not in sys.modules:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    from ..storage import open_store

    for url in urls:
        with contextlib.suppress(Exception):
            open_store(url).warm()


def _require_tls_beyond_loopback(address: str) -> None:
    from distributed.comm import parse_address, parse_host_port

    scheme, location = parse_address(address)
    host = parse_host_port(location)[0] if scheme in ("tcp", "tls") else ""
    if scheme == "tcp" and not _is_loopback(host):
        raise ClusterError(
            f"--scheduler {address}: plaintext connections beyond loopback are refused; use "
            "tls://HOST:PORT with --tls-ca-file, --tls-cert and --tls-key"
        )


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _spawn_without_rerunning_main() -> None:
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
    import sys

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
    import sys

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
def _embedded_cluster(n_workers: int, quiet: bool, dashboard: bool = False, profile: bool = False):
    """``profile``: Dask's statistical profiler on the workers, for the performance
    report and the dashboard. It samples each worker's stack every 10 ms, taking the
    GIL from the task: regressions on 2 workers ran about 4% slower with it on."""
    from distributed import LocalCluster

    _refuse_inside_a_worker()
    _spawn_without_rerunning_main()
    _forget_main_without_a_file()
    _quiet_resource_tracker()
    sweep_stale_semaphores()
    # The nanny sets pre-spawn-environ in the parent before it spawns the worker
    # process, so the variables are there before the worker imports numpy.
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **WORKER_ENV}
    preload = [*dask.config.get("distributed.worker.preload", []), "pipeline.cluster.worker"]
    settings = {
        "distributed.nanny.pre-spawn-environ": environ,
        "distributed.worker.daemon": False,
        "distributed.worker.preload": preload,
        "pipeline.embedded-worker": True,  # see pipeline.cluster.worker
        "distributed.worker.profile.enabled": profile,
        # The embedded cluster shares the driver's cores: Dask's event-loop tick (every
        # 20 ms in the scheduler, each nanny and each worker) and system monitors
        # (every 0.5 s) kept an idle driver at 5.8% of a core and its 2 workers at 2.0
        # and 2.4%; 1.8, 0.8 and 0.4% with these. A tick still catches a loop blocked
        # for longer than its limit (3 s).
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
        yield cluster
    finally:
        _close_embedded(cluster)


def _close_embedded(cluster) -> None:
    """Close the embedded cluster; a failure to is logged, never raised. A worker whose
    process a unit's code ended just before is being restarted by its nanny, and a
    close then can fail in Dask ("can only join a started process", about 1 run in
    20 of the test of such a unit): the run is over and its results stored, so a
    second try, then a warning. The same failure can also leave Dask's close waiting
    for good (its error raised in a callback, once in a CI run): each try is bounded."""
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


def _dask_tls_configured() -> bool:
    """Whether Dask's own configuration (``distributed.comm.tls.*``) gives the client
    TLS material, as a deployment may set it instead of our settings."""
    import dask

    tls = dask.config.get("distributed.comm.tls", {}) or {}
    client = tls.get("client") or {}
    return bool(tls.get("ca-file") or client.get("cert"))


def _security(options: RunOptions):
    """Dask ``Security`` from the --tls-* settings; ``None`` leaves Dask's own
    configuration (``distributed.comm.tls.*``, ``DASK_DISTRIBUTED__COMM__TLS__*``) in charge."""
    files = {
        "--tls-ca-file": options.tls_ca_file,
        "--tls-cert": options.tls_cert,
        "--tls-key": options.tls_key,
    }
    if not any(files.values()):
        return None
    absent = [flag for flag, value in files.items() if not value]
    if absent:
        raise ClusterError(
            f"TLS needs {', '.join(absent)} too (or PIPELINE_TLS_CA_FILE, "
            "PIPELINE_TLS_CERT, PIPELINE_TLS_KEY)"
        )
    from .tls import tls_security

    try:
        return tls_security(*files.values())
    except FileNotFoundError as exc:
        raise ClusterError(str(exc)) from exc
