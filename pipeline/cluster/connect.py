"""Connecting to a Dask cluster: an embedded ``LocalCluster`` or an existing scheduler."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import dask

from ..config import RunOptions, connection_options
from ..errors import ClusterError
from .embedded import check_embedded_workers, embedded_cluster, spawn_without_rerunning_main

__all__ = ["connect", "count_workers", "worker_threads"]


log = logging.getLogger(__name__)

#: How long closing the client may take when the run already failed.
CLOSE_AFTER_ERROR_SECONDS = 5


@contextlib.contextmanager
def connect(options: RunOptions | None = None, *, quiet: bool = True, **settings) -> Iterator:
    """Yield a ``distributed.Client``: to the scheduler if one is set, else to a new
    embedded cluster of single-threaded worker processes that is closed on exit.

    The settings are ``options`` (a :class:`RunOptions`), or else the connection's
    settings given as keywords (``workers=2``, ``scheduler=``, ``dashboard=``, the
    ``tls_*`` files, ``direct_to_workers=``) over the ``PIPELINE_*`` variables, as
    ``pipeline run`` resolves them: ``connect()`` alone starts the embedded cluster,
    or reaches ``PIPELINE_SCHEDULER`` with ``PIPELINE_TLS_*`` where they are set.

    A remote scheduler is usually behind a load balancer that forwards only the
    scheduler's port, so the client gets results through the scheduler
    (``direct_to_workers=False``) unless ``--direct-to-workers`` says the driver
    can reach every worker's own address.
    """
    from distributed import Client

    options = connection_options(options, settings)
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
        client = _reach(address, security, bool(options.direct_to_workers))
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
        embedded_cluster(
            options.workers or os.cpu_count() or 1,
            quiet,
            options.dashboard,
            profile=bool(options.report or options.dashboard),
        ) as cluster,
        _closing(Client(cluster, set_as_default=True)) as client,
    ):
        client.run(_quiet_closing)
        yield client


def connect_seconds() -> float:
    """How long a client tries to reach the scheduler, and to reach it again after losing
    it: Dask's ``distributed.comm.timeouts.connect`` (the image's 60 s; Dask's 30 s)."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("distributed.comm.timeouts.connect", "30s")))


def _reach(address: str, security, direct_to_workers: bool):
    """A client of the scheduler at ``address``. An address that accepts connections and
    closes them (a load balancer with no healthy scheduler behind it yet, as while a
    stack starts) is tried again until the connect timeout; then an error says so."""
    from distributed import Client

    timeout = connect_seconds()
    deadline = time.monotonic() + timeout
    waiting = False
    while True:
        try:
            _probe(address, security, timeout)
            break
        except (OSError, TimeoutError, ValueError, RuntimeError) as exc:
            if not _answered(exc):
                raise ClusterError(
                    f"cannot reach the Dask scheduler at {address} "
                    f"(--scheduler / PIPELINE_SCHEDULER): {exc}"
                ) from exc
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the load balancer at {address} answered but no scheduler is behind "
                    f"it (waited {timeout:g} s): start the scheduler, or check the "
                    "balancer's health checks"
                ) from None
            if not waiting:
                waiting = True
                log.warning("%s answered but no scheduler is behind it yet; waiting up to "
                            "%g s for one", address, timeout)  # fmt: skip
            time.sleep(1.0)
    try:
        return Client(
            address,
            security=security,
            timeout=timeout,
            set_as_default=True,
            direct_to_workers=direct_to_workers,
        )
    except (OSError, TimeoutError, ValueError, RuntimeError) as exc:
        raise ClusterError(
            f"cannot reach the Dask scheduler at {address} (--scheduler / PIPELINE_SCHEDULER): "
            f"{exc}"
        ) from exc


def _probe(address: str, security, timeout: float) -> None:
    """Open one connection to ``address`` as a client would, and close it; raise what
    opening it raised. (A client made and failed leaves an object that, collected,
    waits seconds to close and prints a traceback.) In a thread of its own: the
    caller may be in an event loop (a notebook's)."""
    import asyncio

    from distributed.comm import connect as open_comm

    args = security.get_connection_args("client") if security is not None else {}

    async def attempt() -> None:
        comm = await open_comm(address, timeout=timeout, **args)
        await comm.close()

    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(attempt())
        except BaseException as exc:  # (raised in the caller's thread below)
            failed.append(exc)

    thread = threading.Thread(target=run, name="pipeline-probe-scheduler", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def _answered(exc: BaseException) -> bool:
    """Whether a failed connection was accepted and then closed by the other end (what a
    load balancer does with no server behind it), not refused or unanswered."""
    from distributed.comm.core import CommClosedError

    text = str(exc)
    return isinstance(exc, CommClosedError | ConnectionResetError) or any(
        s in text for s in ("IOStream is not idle", "Stream is closed", "reset by peer")
    )


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
        # wait long on a scheduler that is gone: a client still reconnecting through a
        # load balancer waits out its connect timeout, then raises TimeoutError.
        with contextlib.suppress(Exception):
            client.close(timeout=CLOSE_AFTER_ERROR_SECONDS)
        raise
    client.close()


class ClusterStart:
    """:func:`connect` begun in a thread, so that the cluster starts (and its workers
    import ``modules`` and open the stores at ``urls``, and ``set_up(client)`` runs:
    the jobs' code shipped, say) while the driver validates its inputs. :meth:`client`
    waits for it and raises what failed; leaving the ``with`` block closes it, whatever
    happened meanwhile."""

    def __init__(
        self,
        options: RunOptions,
        modules: tuple[str, ...] = (),
        urls: tuple[str, ...] = (),
        set_up: Callable[[Any], None] | None = None,
    ):
        check_embedded_workers(options)  # at once, not after the inputs are checked
        if not options.scheduler:
            spawn_without_rerunning_main()  # it inspects the caller's frames: this thread's
        self._stack = contextlib.ExitStack()
        self._client = None
        self._error: BaseException | None = None
        #: Seconds the start took, and of them the workers' imports and ``set_up``.
        self.seconds = self.import_seconds = self.set_up_seconds = 0.0
        self._thread = threading.Thread(
            target=self._start,
            args=(options, modules, urls, set_up),
            name="pipeline-cluster-start",
        )
        self._thread.start()

    def _start(self, options: RunOptions, modules, urls, set_up) -> None:
        t0 = time.perf_counter()
        try:
            client = self._stack.enter_context(connect(options))
            t1 = time.perf_counter()
            if (modules or urls) and not options.scheduler:  # a fleet's workers live on
                client.run(prepare_worker, list(modules), list(urls))
            t2 = time.perf_counter()
            self.import_seconds = t2 - t1
            if set_up is not None:
                set_up(client)
                self.set_up_seconds = time.perf_counter() - t2
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
    try:
        host = parse_host_port(location)[0] if scheme in ("tcp", "tls") else ""
    except ValueError as exc:  # ("missing port number in address 'host'": a traceback)
        raise ClusterError(
            f"--scheduler {address}: {exc}; expected tls://HOST:PORT (or tcp://HOST:PORT on "
            "this machine's loopback)"
        ) from None
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


def _dask_tls_configured() -> bool:
    """Whether Dask's own configuration (``distributed.comm.tls.*``) gives the client
    TLS material, as a deployment may set it instead of our settings."""

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


def worker_threads(client) -> int:
    """The cluster's worker threads, in one small request: the scheduler's totals, not
    every worker's details (asked in a loop at a thousand workers, those pinned a
    scheduler's core: distributed issue 9043). Clients older than the ``n_workers``
    argument count the workers' threads."""
    try:
        return int(client.scheduler_info(n_workers=0)["total_threads"])
    except (TypeError, KeyError):
        return sum(client.ncores().values())


def count_workers(client) -> int:
    """The cluster's worker threads, at least one (what the planner sizes for)."""
    return max(1, worker_threads(client))
