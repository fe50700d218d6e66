"""The project's exceptions: one module, subclassing built-ins where natural.

Every message names the file, column or setting at fault and what was expected,
so that a CLI user can fix the input without reading a traceback.
"""

from __future__ import annotations

__all__ = [
    "ClusterError",
    "ConfigError",
    "InputError",
    "Interrupted",
    "JobRunning",
    "PipelineError",
    "StorageError",
]


class PipelineError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(PipelineError, ValueError):
    """A job file, flag or environment variable holds a value we cannot use."""


class InputError(PipelineError, ValueError):
    """Input data (frames, datasets) is missing or not what the job expects."""


class StorageError(PipelineError, OSError):
    """Reading or writing the store failed; the cause is chained."""


class ClusterError(PipelineError, RuntimeError):
    """The Dask cluster could not be started or reached."""


class JobRunning(PipelineError, RuntimeError):
    """Another run of the same job is writing the same output."""


class Interrupted(KeyboardInterrupt):
    """The user pressed Ctrl-C during a run: what is complete stays, a rerun resumes."""

    def __init__(self, job_id: str, units_complete: int, units: int, unit_name: str = "unit"):
        self.job_id, self.units_complete, self.units = job_id, units_complete, units
        super().__init__(
            f"interrupted: job {job_id!r} has {units_complete:,} of {units:,} {unit_name}s "
            "complete; run the same command again to resume"
        )
