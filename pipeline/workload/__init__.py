"""The workload contract: what a plug-in writes or receives, nothing else.

``Workload`` (:mod:`.workload`): the hooks a plug-in fills, grouped by concern;
``TableResults`` (:mod:`.table_results`): its output's hooks, named by
``Workload.results``; ``Task``, ``TaskOutput``, ``OutputFile``, ``UnitFailure``
(:mod:`.task`): a task and what it returns."""

# (noqa: the names of CONTRACT, which __all__ holds; ruff does not read a list's name there)
from .table_results import TableResults  # noqa: F401
from .task import USER_ERRORS, OutputFile, Task, TaskOutput, UnitFailure, unit_label  # noqa: F401
from .workload import Workload  # noqa: F401

#: What a plug-in writes or receives: ``pipeline`` exports these names as they are.
CONTRACT = ["OutputFile", "TableResults", "Task", "TaskOutput", "UnitFailure", "Workload"]

__all__ = ["CONTRACT", *CONTRACT, "USER_ERRORS", "unit_label"]
