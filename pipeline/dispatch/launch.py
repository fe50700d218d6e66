"""One call's tasks as the runner tracks them: not heard from, submitted, retried; and
what launches lists of tasks for the planner (:class:`Launcher`)."""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..storage import Store
from ..workload import Task, Workload
from .receipts import TaskReceipt

__all__ = ["Launch", "Launcher"]


@dataclass
class Launch:
    """One call's tasks: those not heard from, their futures and attempts."""

    pending: dict[int, Task]
    futures: dict[int, Any] = field(default_factory=dict)
    attempts: collections.Counter = field(default_factory=collections.Counter)
    ready: collections.deque = field(default_factory=collections.deque)
    #: Tasks Dask gave up on, to run again alone once the others are done.
    suspects: list[Task] = field(default_factory=list)
    named: collections.Counter = field(default_factory=collections.Counter)
    retries: collections.Counter = field(default_factory=collections.Counter)
    #: When Dask said a task finished whose receipt has not come (monotonic seconds).
    unreceipted: dict[int, float] = field(default_factory=dict)
    generation: int = 0
    #: Tasks not submitted yet, in order, and how many may be on the cluster at once.
    waiting: collections.deque = field(default_factory=collections.deque)
    window: int = 0
    #: Each submitted task's key, by index.
    keys: dict[int, str] = field(default_factory=dict)
    #: Since when the run is down to its last tasks (monotonic), and the copies of
    #: each task submitted, backups or for being lost (:mod:`.stragglers`).
    tail_since: float | None = None
    copies: collections.Counter = field(default_factory=collections.Counter)
    #: The copies of a task on the cluster beside its first submission, by index
    #: (:mod:`.copies`), and the workers the scheduler sent each task to.
    extra: dict[int, list] = field(default_factory=dict)
    tried: dict[int, set] = field(default_factory=dict)
    #: The run's task times (from receipts), and its number of tasks.
    times: list[float] = field(default_factory=list)
    size: int = 0

    def __post_init__(self) -> None:
        self.size = self.size or len(self.pending)


class Launcher(Protocol):
    """What runs the probes' tasks (the driver's :class:`~pipeline.joblib.JobRunner`):
    its workload, store and client, and a list of tasks launched, receipts as they come."""

    workload: Workload
    store: Store | None
    client: Any

    def launch(self, tasks: Sequence[Task]) -> Iterator[TaskReceipt]: ...
