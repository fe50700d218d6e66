"""The workload contract: what a plug-in writes or receives, nothing else.

``Workload`` (:mod:`.workload`): the hooks a plug-in fills, grouped by concern;
``TableResults`` (:mod:`.table_results`): its output's hooks, named by
``Workload.results``; ``Task``, ``TaskOutput``, ``OutputFile``, ``UnitFailure``
(:mod:`.task`): a task and what it returns."""

from .table_results import TableResults
from .task import USER_ERRORS, OutputFile, Task, TaskOutput, UnitFailure, unit_label
from .workload import Workload

__all__ = [
    "USER_ERRORS",
    "OutputFile",
    "TableResults",
    "Task",
    "TaskOutput",
    "UnitFailure",
    "Workload",
    "unit_label",
]
