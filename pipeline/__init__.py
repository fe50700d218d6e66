"""pipeline: a Dask-distributed job runner for machine-learning data work."""

__version__ = "0.1.0"

from .cluster.connect import connect
from .config import RunOptions
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
from .jobs import Job, load_jobs, run_jobs
from .results import IncompleteJob, results_table
from .runner import run_job
from .storage import LocalStore, Store, open_file, open_store
from .summary import RunSummary
from .verify import JobCheck, verify_output
from .workload import Task, TaskOutput, UnitFailure, Workload, checksum
from .workloads.cubes.delivery import iter_cube_batches, iter_cubes
from .workloads.cubes.shards import read_shard
from .workloads.cubes.workload import CubeJob, CubeWorkload
from .workloads.map.usercode import unit_seed
from .workloads.map.workload import MapJob, MapWorkload
from .workloads.map.workload import run_map as map

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
    # workloads
    "CubeJob",
    "CubeWorkload",
    "Task",
    "TaskOutput",
    "UnitFailure",
    "Workload",
    "checksum",
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
