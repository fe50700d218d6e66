"""The workload contract: the hooks a plug-in fills, grouped by concern (docs/plugins.md)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from ..storage import Store
from .table_results import MOVED_HOOKS, TableResults
from .task import Task, TaskOutput, UnitFailure

__all__ = ["Workload"]


class Workload(ABC):
    """A job's work: ``n_units`` independent units, run in tasks on workers.

    Instances are pickled into every task: keep them small (settings and paths,
    never data). Methods marked *worker* run in a worker process; the others in the
    driver. The members come in groups, as docs/plugins.md lists them: the required
    ones, then optional ones by concern, each with a default that suits most.
    """

    # -- required: what the job is, its validation, and a task ---------------------------

    #: The name used as ``workload = "..."`` in job files.
    kind: ClassVar[str]
    #: The dataclass of its settings (fields made with ``pipeline.setting``).
    settings_class: ClassVar[type]
    job_id: str
    #: Set by ``preflight``: at least 1.
    n_units: int

    @classmethod
    @abstractmethod
    def from_settings(cls, settings: Any, job_id: str, options: Any) -> Workload:
        """The workload of one resolved job (``options``: its ``RunOptions``)."""

    @abstractmethod
    def preflight(self) -> None:
        """Validate every input and set ``n_units``; raise ``InputError``/``ConfigError``
        before any task. The runner calls it once per job and command."""

    @abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """The JSON-able settings that determine the output bytes (checked on resume)."""

    @abstractmethod
    def run_task(self, task: Task, store: Store | None) -> TaskOutput:
        """Worker: run the task's units; return the tables and files they made (the
        runner writes them and lists them in the task's manifest entry) and the units
        that failed."""

    # -- messages: what a unit is called, and the run's first line -----------------------

    unit_name: str = "unit"
    #: What a run's summary calls the time its tasks compute ("building" cubes).
    work_name: str = "work"

    def describe(self) -> str:
        """The run's first line: which job, of how many units."""
        return f"{self.kind} job {self.job_id!r}: {self.n_units} {self.unit_name}s"

    # -- planning: how units are cut into tasks (docs/planning.md); the defaults suit
    #    units of equal cost ---------------------------------------------------------------

    #: Tasks hold a multiple of this many units (e.g. whole shards).
    granularity: int = 1

    def natural_boundaries(self) -> Sequence[int] | None:
        """Unit indices where a task may start without sharing reads with the task
        before it (row groups, files, shards); None: every ``granularity`` units."""
        return None

    def unit_weights(self) -> Sequence[float] | None:
        """Each unit's relative cost (e.g. its rows), or None when they are alike."""
        return None

    def read_bytes(self, start: int, stop: int) -> int:
        """Input bytes a task of units ``start..stop-1`` would read (0: not known)."""
        return 0

    def output_bytes(self, units: int) -> int | None:
        """Bytes ``units`` of its units write, when known before they run (cubes know
        exactly): a local output is checked for that much free space before any task.
        None: not known."""
        return None

    # -- cluster: where tasks read, and what workers need before the first task ---------

    def input_urls(self) -> Sequence[str]:
        """Before ``preflight``: where its tasks read (folders, files, ``s3://``
        prefixes, or globs of files); the workers open these stores while the driver
        validates, and a job whose output is inside one (or its own folder holds
        one) is refused."""
        return ()

    #: Modules its tasks import: loaded on every worker while the driver validates the
    #: job's inputs, rather than by each worker's first task.
    worker_modules: ClassVar[tuple[str, ...]] = ()

    def prepare_cluster(self, client) -> None:
        """Anything the workers need before the first task (e.g. shipped code)."""
        return None

    # -- failures and resume: units that failed as data, and what a rerun does -----------

    def unit_key(self, unit: int) -> str:
        """Which unit ``unit`` is, for the failures a run lists (``ticker='AAA'``),
        when its number alone does not say; "" for none."""
        return ""

    def recorded_failures(self, store: Store, tasks: list[Task]) -> list[UnitFailure]:
        """Units of these complete tasks that failed as data (recorded in the
        output, so a rerun would not change them)."""
        return []

    #: Whether the next run calls again the units ``recorded_failures`` lists (user code
    #: can fail for passing reasons): their tasks run again for those units alone, the
    #: others' rows kept; else a recorded failure is the unit's answer.
    reruns_failed_units: bool = False

    #: Settings of the fingerprint that a resumed run may change: they decide how the
    #: units still to run are run, not what a unit writes (the map's ``retries``).
    resume_may_change: tuple[str, ...] = ()

    #: Settings of the fingerprint that are the workload's *code*: they decide how a
    #: unit is computed, not what it means (the map's function source and shipped
    #: code, the regressions' engine, a plug-in's own version). A run with
    #: ``keep_done`` (``--keep-done``) may change them: the tasks done are kept and
    #: only failed and missing units run with the new code. Each task's manifest entry
    #: records the code version that made it (:mod:`pipeline.manifest`).
    code_settings: tuple[str, ...] = ()

    # -- results and verify: the objects, the manifest, and `pipeline results`/`verify` --

    #: Whether tasks write to the store (resume needs a store).
    writes_output: bool = True

    #: Its output's hooks: the manifest, ``finalize`` once every task is complete,
    #: ``pipeline results`` and ``pipeline verify`` (:class:`TableResults`, whose
    #: defaults serve tasks that return tables and files; a subclass overrides what
    #: differs).
    results: ClassVar[type[TableResults]] = TableResults

    def __init_subclass__(cls, **kwargs) -> None:
        """Refuse a workload written for an older contract: an output hook it still
        defines on itself (before ``results``), or ``tasks_to_retry`` (before
        ``reruns_failed_units`` said it), would be ignored without a word, so its
        import fails naming them."""
        super().__init_subclass__(**kwargs)
        moved = [name for name in MOVED_HOOKS if name in vars(cls)]
        if moved:
            raise TypeError(
                f"{cls.__module__}.{cls.__qualname__} defines {', '.join(moved)}: these "
                "are members of the workload's results now, not of the Workload: write "
                "them on a subclass of pipeline.TableResults and name it with "
                "`results = ThatClass` (docs/plugins.md)"
            )
        if "tasks_to_retry" in vars(cls):
            raise TypeError(
                f"{cls.__module__}.{cls.__qualname__} defines tasks_to_retry: it is no "
                "member of the Workload now: set `reruns_failed_units = True` instead, "
                "and the next run calls again the units its recorded_failures lists "
                "(docs/plugins.md)"
            )
