"""The project's exceptions: one module, subclassing built-ins where natural.

Every message names the file, column or setting at fault and what was expected,
so that a CLI user can fix the input without reading a traceback.
"""

from __future__ import annotations

import contextlib

__all__ = [
    "ClusterError",
    "ConfigError",
    "InputError",
    "Interrupted",
    "InterruptedBeforeTasks",
    "JobRunning",
    "PipelineError",
    "StorageError",
    "UnreadableObject",
    "WorkloadError",
]


class PipelineError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(PipelineError, ValueError):
    """A job file, flag or environment variable holds a value we cannot use."""


class InputError(PipelineError, ValueError):
    """Input data (frames, datasets) is missing or not what the job expects."""


class StorageError(PipelineError, OSError):
    """Reading or writing the store failed; the cause is chained."""


class UnreadableObject(StorageError):
    """A stored object that is not the table it should be (damaged, truncated, another
    file): its name and pyarrow's reason, which names no file."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: not a readable table ({reason})")
        self.where, self.reason = where, reason


class ClusterError(PipelineError, RuntimeError):
    """The Dask cluster could not be started or reached."""


class WorkloadError(PipelineError, RuntimeError):
    """A workload (a plug-in) did not keep the workload contract: the message names it
    and what the contract expects."""


class JobRunning(PipelineError, RuntimeError):
    """Another run of the same job is writing the same output."""


class Interrupted(KeyboardInterrupt):
    """The user pressed Ctrl-C during a run: what is complete stays, a rerun resumes.

    ``recount()`` gives the units complete and whether only the job's finalization is
    left, counted again when the message is told."""

    def __init__(
        self,
        job_id: str,
        units_complete: int,
        units: int,
        unit_name: str = "unit",
        recount=None,
        keeps_output: bool = True,
        finalization_left: bool = False,
    ):
        self.job_id, self.units_complete, self.units = job_id, units_complete, units
        self.unit_name, self._recount, self.keeps_output = unit_name, recount, keeps_output
        self.finalization_left = finalization_left
        super().__init__(self._message())

    def _message(self) -> str:
        job, unit = f"job {self.job_id!r}", self.unit_name
        if not self.keeps_output:  # (cubes with sink none: nothing to resume from)
            return f"interrupted: {job} writes no output, so a rerun starts over"
        if self.finalization_left:
            return (
                f"interrupted: {job} has all {self.units:,} {unit}s done, its manifest not "
                "yet consolidated; run the same command again to finalize it (it runs no "
                "task and starts no cluster)"
            )
        if not self.units_complete:
            return (
                f"interrupted: {job} has none of its {self.units:,} {unit}s complete (no "
                "task of it completed); run the same command again to start it"
            )
        return (
            f"interrupted: {job} has {self.units_complete:,} of {self.units:,} "
            f"{unit}s complete; run the same command again to resume"
        )

    def recounted(self) -> str:
        """The message with the units complete counted again: tasks running at the
        interrupt go on completing until the cluster has stopped, and a rerun finds them."""
        if self._recount is not None:
            with contextlib.suppress(Exception):  # the store gone too: the first count stands
                self.units_complete, self.finalization_left = self._recount()
        return self._message()


class InterruptedBeforeTasks(KeyboardInterrupt):
    """The user pressed Ctrl-C during a batch's start-up (``during`` says which part),
    before any of its tasks ran."""

    def __init__(self, during: str):
        self.during = during
        super().__init__(self.recounted())

    def recounted(self) -> str:
        return (
            f"interrupted while {self.during}: no task ran; run the same command again "
            "(what earlier runs completed is kept)"
        )
