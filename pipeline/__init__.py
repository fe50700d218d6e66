"""pipeline: a Dask-distributed job runner for machine-learning data work."""

__version__ = "0.1.0"

import importlib

from . import joblib as _joblib_backend  # noqa: F401  (registers backend="pipeline")
from . import workload as _workload
from .cluster.connect import connect
from .config import RunOptions, check_settings, setting
from .driver import run_jobs
from .errors import (
    ClusterError,
    ConfigError,
    InputError,
    JobRunning,
    PipelineError,
    StorageError,
    UnreadableObject,
    WorkloadError,
)
from .jobs import Job, load_jobs
from .layout import attempt_key, part_key
from .manifest import checksum, listed_parts
from .results import IncompleteJob, results_table
from .runner import run_job
from .storage import (
    LocalStore,
    Store,
    open_file,
    open_store,
    read_parquet_object,
    write_parquet,
)
from .summary import RunSummary, summary_lines
from .verify import JobCheck, verify_output
from .workload import OutputFile, TableResults, Task, TaskOutput, UnitFailure, Workload  # noqa: F401

#: The built-in workloads' names, imported on first use: ``import pipeline`` (and every
#: command) loads a workload only when a job uses it.
_LAZY = {
    "CubeJob": "pipeline.workloads.cubes",
    "CubeWorkload": "pipeline.workloads.cubes",
    "iter_cubes": "pipeline.workloads.cubes.delivery",
    "iter_cube_batches": "pipeline.workloads.cubes.delivery",
    "read_shard": "pipeline.workloads.cubes",
    "MapJob": "pipeline.workloads.map",
    "MapWorkload": "pipeline.workloads.map",
    "unit_seed": "pipeline.workloads.map",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def map(fn, *, client=None, verbose: int = 1, **settings):  # (as users call it: pipeline.map)
    """Call ``fn`` per unit of one input (``grid=``, ``data=`` or ``files=``), on the
    embedded cluster or ``client``'s, writing the rows it returns under ``output``;
    return the run's :class:`RunSummary`. ``fn`` may be defined in the calling script
    (it travels by value); the other settings are the ``map`` job's and the run's, as
    in a job file, and those not given come from ``PIPELINE_*`` variables. A second
    call resumes: only units not yet done, or that raised, run. See docs/map.md.

    ``verbose``: 1 (the default) tells the run as ``pipeline run`` does: its first
    line and its progress on standard error (a bar on a terminal, else a line at each
    10 % of the units and every ``progress_seconds``), the summary's lines at its end,
    all on standard error (standard output is the calling program's); 2 adds ``-v``'s
    lines; 0 tells nothing. ``progress=False`` leaves out the progress
    alone (``progress=True`` shows it with ``verbose=0``)."""
    import sys
    import time

    from .driver import run_workload
    from .workloads.map import map_job

    started = time.perf_counter()
    if not verbose and settings.get("progress") is None:
        settings["progress"] = False
    workload, options = map_job(fn, client=client, **settings)
    echo = (lambda message: print(message, file=sys.stderr, flush=True)) if verbose else None
    summary = run_workload(workload, options, client=client, echo=echo, started=started)
    if verbose:
        for line, _ in summary_lines(summary, verbose > 1):
            print(line, file=sys.stderr, flush=True)
    return summary


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    # running jobs
    "Job",
    "RunOptions",
    "RunSummary",
    "connect",
    "load_jobs",
    "run_job",
    "run_jobs",
    "results_table",
    "IncompleteJob",
    "verify_output",
    "JobCheck",
    # writing a workload (docs/plugins.md): the contract's names, as pipeline.workload
    # lists them (noqa above: ruff does not read a list's name in __all__)
    *_workload.CONTRACT,
    "check_settings",
    "attempt_key",
    "checksum",
    "listed_parts",
    "part_key",
    "setting",
    # built-in workloads (imported on first use)
    "CubeJob",
    "CubeWorkload",
    "iter_cube_batches",
    "iter_cubes",
    "map",
    "MapJob",
    "MapWorkload",
    "unit_seed",
    "read_shard",
    # storage
    "LocalStore",
    "Store",
    "open_file",
    "open_store",
    "read_parquet_object",
    "write_parquet",
    # errors
    "ClusterError",
    "ConfigError",
    "InputError",
    "JobRunning",
    "PipelineError",
    "StorageError",
    "UnreadableObject",
    "WorkloadError",
]
