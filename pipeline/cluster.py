"""Connecting to a Dask cluster: an embedded ``LocalCluster`` or an existing scheduler."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import dask

from .config import RunOptions
from .errors import ClusterError

__all__ = ["THREAD_ENV", "connect"]

#: Set in every worker process before numpy loads there: one task per worker
#: thread, and BLAS must not start its own threads on top of that.
THREAD_ENV = {"MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

log = logging.getLogger(__name__)


@contextlib.contextmanager
def connect(options: RunOptions, *, quiet: bool = True) -> Iterator:
    """Yield a ``distributed.Client``: to ``options.scheduler`` if set, else to a new
    embedded cluster of single-threaded worker processes that is closed on exit."""
    from distributed import Client

    if options.scheduler:
        security = _security(options)
        try:
            client = Client(options.scheduler, security=security, timeout="30s",
                            set_as_default=True, **_direct_to_workers(options))
        except (OSError, TimeoutError) as exc:
            raise ClusterError(f"cannot reach the Dask scheduler at {options.scheduler} "
                               f"(--scheduler / PIPELINE_SCHEDULER): {exc}") from exc
        with client:
            yield client
        return

    if options.tls_cert or options.tls_key or options.tls_ca_file:
        log.info("TLS settings are ignored by the embedded cluster (loopback only)")
    with _embedded_cluster(options.workers or os.cpu_count() or 1, quiet) as cluster:
        with Client(cluster, set_as_default=True) as client:
            yield client


@contextlib.contextmanager
def _embedded_cluster(n_workers: int, quiet: bool):
    from distributed import LocalCluster

    # The nanny sets pre-spawn-environ in the parent before it spawns the worker
    # process, so the variables are there before the worker imports numpy.
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **THREAD_ENV}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ,
                          "distributed.worker.daemon": False}):
        try:
            cluster = LocalCluster(
                n_workers=n_workers, threads_per_worker=1, processes=True,
                host="127.0.0.1", dashboard_address="127.0.0.1:0",
                silence_logs=logging.ERROR if quiet else logging.WARNING,
            )
        except Exception as exc:
            raise ClusterError(f"cannot start the embedded cluster of {n_workers} "
                               f"workers: {exc}") from exc
    with cluster:
        yield cluster


def _security(options: RunOptions):
    files = (options.tls_ca_file, options.tls_cert, options.tls_key)
    if not any(files):
        if options.scheduler.startswith("tls://"):
            return None  # Dask's own configuration (distributed.comm.tls.*) applies
        return None
    if not all(files):
        raise ClusterError("TLS needs all of --tls-ca-file, --tls-cert and --tls-key "
                           "(or PIPELINE_TLS_CA_FILE, PIPELINE_TLS_CERT, PIPELINE_TLS_KEY)")
    from .tls import tls_security

    return tls_security(*files)


def _direct_to_workers(options: RunOptions) -> dict:
    return {}
