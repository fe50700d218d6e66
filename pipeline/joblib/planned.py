"""A job's planned tasks as joblib calls: ``delayed(run_planned)(task)``.

The driver hands each task of its plan to ``joblib.Parallel`` on the ``pipeline``
backend as the call ``run_planned(task)``; the backend recognises it and sends the
:class:`~pipeline.workload.Task` itself through the job's runner, so a worker runs it
as any of the job's tasks (:func:`pipeline.dispatch.task.run_task`: its outputs, its
manifest entry, its receipt) and the call's result is the task's receipt.
"""

from __future__ import annotations

from ..workload import Task

__all__ = ["planned_task", "run_planned"]


def run_planned(task: Task):
    """The joblib call of one planned task. It runs on the cluster through the job's
    runner (which knows the job's store and receipt topic), never in this process:
    called here (a ``Parallel`` on another backend), it refuses."""
    raise RuntimeError(
        f"task {task.index} of a pipeline job runs through the pipeline joblib backend's "
        "runner (JobRunner.launch), not as a call of another backend"
    )


def planned_task(items: list) -> Task | None:
    """The task of a joblib batch ``items`` that is one planned task's call, else None;
    a batch of several planned calls is refused (each is a joblib batch of its own:
    ``batch_size=1``, so that each receipt is a result as it comes)."""
    planned = [args[0] for func, args, _ in items if func is run_planned]
    if not planned:
        return None
    if len(items) != 1:
        raise ValueError("planned tasks go to the pipeline backend one per batch (batch_size=1)")
    return planned[0]
