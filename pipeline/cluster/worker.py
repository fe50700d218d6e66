"""Dask worker preload (``distributed.worker.preload``): import what tasks use.

The embedded cluster preloads it, and so does every deployment
(``DASK_DISTRIBUTED__WORKER__PRELOAD`` of worker.env). Without it each worker's first task
pays about half a second for imports, pandas above all (pyarrow loads it on its
first array), which on a short job is time no unit is being built.

The embedded cluster's workers also ignore Ctrl-C: a terminal sends it to the whole
process group, and the driver, which stops the cluster, is the one to answer it
(a worker that answered it would print a traceback of its interrupted task).
"""

import signal
import threading

import dask
import numpy  # noqa: F401
import pandas  # noqa: F401
import pyarrow
import pyarrow.parquet  # noqa: F401
import xxhash  # noqa: F401

# The code every task runs (``pipeline.dispatch``) is a preload of its own, listed after
# this one (worker.env, the embedded cluster); a job's workload's own modules are loaded
# while the driver checks its inputs (``Workload.worker_modules``).

if dask.config.get("pipeline.embedded-worker", False) and (
    threading.current_thread() is threading.main_thread()
):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
