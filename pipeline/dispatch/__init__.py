"""Running a workload's tasks on the cluster: the task a worker runs (:mod:`.task`),
the objects it returns written and listed in its manifest entry (:mod:`.outputs`),
its receipt's way back (:mod:`.receipts`), the workload's way out (:mod:`.shipping`),
the runner of lists of tasks (:mod:`.task_runner`) and task profiles (:mod:`.profiling`)."""

from .lease import release_left_tasks
from .profiling import run_queue_seconds
from .session import send_promptly
from .task import execute_task
from .task_runner import DASK_LEVEL_RETRIES, WORKERLESS_SECONDS, TaskRunner

__all__ = [
    "DASK_LEVEL_RETRIES",
    "WORKERLESS_SECONDS",
    "TaskRunner",
    "execute_task",
    "release_left_tasks",
    "run_queue_seconds",
    "send_promptly",
]
