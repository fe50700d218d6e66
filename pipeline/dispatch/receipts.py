"""A task's receipt (:class:`TaskReceipt`) and its way back: a worker publishes each
task's receipt as an event on the client's own topic, and the driver routes it to the
run that sent the task.

An event travels on the worker's stream to the scheduler (the one its heartbeats and
"task finished" messages take), and the scheduler forwards it on the client's stream:
no connection to the worker is opened, as fetching a result would need, and an event
is published before the worker reports the task finished, so a finished task's
receipt is already here. The scheduler keeps a topic's last events (Dask's
``distributed.admin.low-level-log-length``), which is how a driver that reconnected
catches up; it drops a client's topic once the client is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from ..workload import Task, UnitFailure

__all__ = [
    "ReceiptTopic",
    "TaskReceipt",
    "decode",
    "encode",
    "failed_receipt",
    "killed_receipt",
]


@dataclass(frozen=True)
class TaskReceipt:
    """The small summary of a task that travels back to the driver."""

    index: int
    units: int
    failures: tuple[UnitFailure, ...]
    bytes_written: int
    seconds: float
    busy_seconds: float
    worker: str
    fingerprint: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    profile: bytes | None = None  # marshalled cProfile statistics (profile_tasks)
    bytes_read: int = 0
    bytes_needed: int = 0
    read_seconds: float = 0.0
    #: When the task started (time.time() on its worker) and the worker process's id:
    #: the report page's timeline.
    started: float = 0.0
    pid: int = 0
    #: TaskOutput.recorded_failures: None when the task did not say.
    recorded: tuple[UnitFailure, ...] | None = None
    #: CPU time of the worker process during the task: against ``seconds``, whether
    #: the task computed or waited (sleep, network, disk).
    cpu_seconds: float = 0.0
    #: Seconds the task's thread was runnable but waiting for a core (the machine's
    #: cores busy with other work); None where not measured (not Linux).
    runq_seconds: float | None = None
    #: The Dask worker that ran it ('' outside Dask): workers can share a process (a
    #: LocalCluster's threads, the fleet simulation), where host and pid are not one.
    worker_address: str = ""
    #: TaskOutput.value: the task's small value back to the driver (None for most).
    value: bytes | None = None
    #: Another attempt of the task committed its entry first: this one removed what
    #: it wrote, and the task is complete with the other's objects.
    lost: bool = False

    @property
    def complete(self) -> bool:
        return not self.failures

    @property
    def worker_key(self) -> tuple[str, int, str]:
        """The Dask worker that ran it: host, process and address (workers can share a
        process)."""
        return (self.worker, self.pid, self.worker_address)


#: The key of a receipt's event message (other events on the topic are Dask's).
MARK = "pipeline-receipt"


def encode(receipt: TaskReceipt, token: str) -> dict[str, Any]:
    """The receipt as an event message of plain types (msgpack's), for run ``token``.
    Failures come as runs of consecutive units failed alike: a task that failed whole
    is one run, not a message per unit."""
    fields = {f.name: getattr(receipt, f.name) for f in dataclasses.fields(receipt)}
    fields["failures"] = _runs(receipt.failures)
    fields["recorded"] = None if receipt.recorded is None else _runs(receipt.recorded)
    return {MARK: token, "receipt": fields}


def decode(message: dict[str, Any]) -> TaskReceipt:
    fields = dict(message["receipt"])
    fields["failures"] = _expand(fields["failures"])
    if fields.get("recorded") is not None:
        fields["recorded"] = _expand(fields["recorded"])
    fields["phases"] = dict(fields.get("phases") or {})
    return TaskReceipt(**fields)


def _runs(failures) -> list[list]:
    """[first unit, last unit + 1, error type, message, key] for each run of failures of
    consecutive integer units with the same error and no key of their own."""
    runs: list[list] = []
    for f in failures:
        last = runs[-1] if runs else None
        if (
            last is not None
            and isinstance(f.unit, int)
            and not f.key
            and not last[4]
            and last[1] == f.unit
            and (last[2], last[3]) == (f.error_type, f.message)
        ):
            last[1] += 1
            continue
        stop = f.unit + 1 if isinstance(f.unit, int) else None
        runs.append([f.unit, stop, f.error_type, f.message, f.key])
    return runs


def _expand(runs: list[list]) -> tuple[UnitFailure, ...]:
    out = []
    for start, stop, error_type, message, key in runs:
        units = range(start, stop) if stop is not None else (start,)
        out.extend(UnitFailure(u, error_type, message, key) for u in units)
    return tuple(out)


class ReceiptTopic:
    """The receipts published on ``client``'s topic, routed by run token into one queue
    per run. One per client (:meth:`of`): a client has one handler per topic."""

    def __init__(self, client):
        self.client = client
        self.topic = str(client.id)
        self._queues: dict[str, queue.SimpleQueue] = {}
        self._lock = threading.Lock()
        client.subscribe_topic(self.topic, self._handle)

    @classmethod
    def of(cls, client) -> ReceiptTopic:
        topic = getattr(client, "_pipeline_receipts", None)
        if topic is None:
            topic = client._pipeline_receipts = cls(client)
        return topic

    def open(self, token: str) -> queue.SimpleQueue:
        with self._lock:
            return self._queues.setdefault(token, queue.SimpleQueue())

    def close(self, token: str) -> None:
        """Stop routing run ``token``'s receipts; the last run leaves the topic (the
        scheduler then sends the client none of its own events on it, such as the one
        it logs as the client closes, into a stream that is closing)."""
        with self._lock:
            self._queues.pop(token, None)
            if self._queues or self.client.status != "running":
                return
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic(self.topic)
        self.client._pipeline_receipts = None

    def _handle(self, event) -> None:
        # In the client's event loop: route, never block.
        _time, message = event
        self._route(message)

    def _route(self, message) -> None:
        if isinstance(message, dict) and MARK in message:
            q = self._queues.get(message[MARK])
            if q is not None:
                q.put(message)

    def resubscribe(self) -> None:
        """After the client reconnected: the scheduler forgot the subscription."""
        self.client.subscribe_topic(self.topic, self._handle)

    def catch_up(self) -> int:
        """Route the topic's events the scheduler still holds (those published while the
        client was away among them); duplicates are the runs' to drop. Their count."""
        events = self.client.get_events(self.topic)
        for _time, message in events:
            self._route(message)
        return len(events)


def killed_receipt(error: BaseException, task: Task) -> TaskReceipt:
    """The receipt of a task Dask gave up on, its message saying what that means."""
    if type(error).__name__ != "KilledWorker":
        return failed_receipt(task, error)
    tries = getattr(error, "allowed_failures", 3) + 1
    message = (
        f"the worker process running this task died each of the {tries} times it ran it "
        f"(units {task.start}..{task.stop - 1}): killed (out of memory?) or ended by the "
        "code it ran (a crash in compiled code, os._exit); the other tasks ran on"
    )
    return failed_receipt(task, error, UnitFailure(0, "KilledWorker", message))


def failed_receipt(
    task: Task, error: BaseException, failure: UnitFailure | None = None
) -> TaskReceipt:
    """The receipt of a task that did not run: each unit failed with ``error`` (or
    with ``failure``'s type and message)."""
    one = failure or UnitFailure.from_exception(0, error)
    failures = tuple(dataclasses.replace(one, unit=u) for u in task.units)
    return TaskReceipt(task.index, len(task.units), failures, 0, 0.0, 0.0, "")
