"""Running lists of tasks on the cluster, their receipts back as they complete.

Tasks go to the scheduler with ``Client.map``, a batch of them in one message, each
under a key of its own; receipts come back as events (:mod:`.receipts`), never as
results fetched from a worker. The runner watches the tasks' futures only for what
Dask itself reports: a task given up on (its workers died), or cancelled with the
connection to the scheduler.

Tasks are also held for the driver's client (:mod:`.lease`), so they run on while the
driver's connection is down (a load balancer failing over, a network blip), for a
while. The client reconnects by itself within its connect timeout; the runner then
takes the receipts published meanwhile from the scheduler's log of the topic and
submits the tasks not heard from again under the same keys: the scheduler attaches
those queued or running, and one that completed meanwhile (its key gone) finds its
manifest entry and reports it without running again.

Submissions, copies (:mod:`.copies`) and closing pass one gate (a lock): once closing,
nothing is submitted; copies are decided with the receipts already in taken first.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ClusterError
from ..manifest import CodeStamp
from ..storage import Store
from ..workload import Task, Workload
from . import lease, shipping
from .copies import Copies
from .launch import Launch
from .lease import job_prefix, reconnect_seconds
from .receipts import ReceiptTopic, TaskReceipt, decode, failed_receipt, killed_receipt
from .recovery import forget_receipts, stored_receipts
from .session import INTERRUPTED, send_promptly
from .task import TaskCall, run_task
from .workers import WORKERLESS_SECONDS, Workerless

__all__ = ["DASK_LEVEL_RETRIES", "WORKERLESS_SECONDS", "TaskRunner"]

log = logging.getLogger(__name__)

#: Times a task that failed at the Dask level (not KilledWorker) is submitted again.
DASK_LEVEL_RETRIES = 2
#: Times a task Dask gave up on (its workers kept dying) runs again, alone, after the
#: others: one whose code ends its process does not take the rest along.
SUSPECT_RETRIES = 1
#: Tasks per message to the scheduler: one message of thousands of tasks holds its
#: event loop (heartbeats, other clients) for seconds.
SUBMIT_BATCH = 500
#: Tasks a run keeps on the cluster per worker thread (at least a batch's worth).
IN_FLIGHT_PER_WORKER = 4
#: Seconds between looks at the tasks' futures while receipts come or not.
CHECK_SECONDS = 1.0
#: Seconds a task Dask says finished may go without its receipt before the scheduler's
#: log of the topic is read for it, and then before it is submitted again.
RECEIPT_GRACE = 30.0


@dataclass
class TaskRunner:
    """Runs tasks of one workload on ``client``'s cluster, in launches (:class:`.Launch`)
    that its subclasses fill and read: a job's (:class:`pipeline.joblib.job_runner.JobRunner`),
    joblib users' calls (:class:`pipeline.joblib.call_runner.CallRunner`)."""

    workload: Workload
    store: Store | None
    client: Any
    bar: Any
    profile: bool = False
    rounds: dict[int, int] = field(default_factory=dict)  # (:func:`.commit.with_rounds`)
    #: The code version its tasks record in their entries (the runner's, per run).
    code: CodeStamp | None = None
    #: Called with each task's final receipt as it is read (a run reads its entries).
    on_receipt: Callable[[TaskReceipt], None] | None = None

    def __post_init__(self) -> None:
        send_promptly(self.client)
        self._token = secrets.token_hex(8)
        self._topic = ReceiptTopic.of(self.client)
        self._inbox = self._topic.open(self._token)
        self._launches: list[Launch] = []
        self._owner: dict[int, Launch] = {}
        self._generation = 0
        self._workload = shipping.WorkloadArg(self.client, self.workload)
        self._workerless = Workerless(self.client)
        self._checked = time.monotonic()
        self._holder = lease.ensure_lease(self.client, reconnect_seconds(self.client) + 10.0)
        self._threads = 1
        self._batches = 0  # batches submitted (each ranks after the one before)
        url = self.store.url if self.store is not None else None
        self._job_prefix = job_prefix(self.workload, url)
        self._unheld: list[str] = []  # keys whose hold to let go of
        #: Held to submit tasks or copies, and to close (then nothing more is submitted).
        self._gate = threading.Lock()
        self._closing = False
        again = lambda: self._call(1, True)  # noqa: E731 (what a copy runs with)
        keys = f"{self._job_prefix}{self._token}-"
        self._copies = Copies(self.client, keys, again, self._holder, self._unheld.extend,
                              self._gate, self._heard)  # fmt: skip

    def __enter__(self) -> TaskRunner:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Submit nothing more, cancel the tasks not heard from and their copies (they
        would run on: the scheduler's fire-and-forget client wants them), let go of the
        attempts held, stop listening for receipts, free the workers of the workload."""
        self._stop_submitting()
        for run in list(self._launches):
            self._drop(run, set(run.pending))
        self._copies.close()
        self._let_go()
        self._topic.close(self._token)
        self._workload.close()
        forget_receipts(self.store, self.workload.job_id, self._token)

    def _stop_submitting(self) -> None:
        """Nothing more goes to the scheduler (one it processed after the driver left
        would be reported into a closed connection); after a submission under way."""
        with self._gate:
            self._closing = True

    def _heard(self) -> bool:
        """Under the gate: take the receipts in (no copy of a reported task); False once closing."""
        if self._closing:
            return False
        self._take_inbox()
        return True

    def _drop(self, run: Launch, indices: set[int]) -> None:
        """Stop ``run``'s tasks ``indices`` not heard from: their first submissions and
        their copies (backups, copies of lost tasks) cancelled on the cluster, their
        holds let go of (at the next :meth:`_let_go`), their receipts, if any come,
        dropped."""
        mine = indices & set(run.pending)
        if not mine:
            return
        copies = [copy for i in mine for copy in run.extra.pop(i, [])]
        futures = [run.futures.pop(i) for i in mine if i in run.futures]
        futures += [copy.future for copy in copies]
        if futures and self.client.status == "running":
            with contextlib.suppress(Exception):  # (the connection failing: the lease
                self.client.cancel(futures, force=True)  # lets go of them)
        for index in mine:
            run.pending.pop(index, None)
            self._owner.pop(index, None)
            run.unreceipted.pop(index, None)
            run.tried.pop(index, None)
            key = run.keys.pop(index, None)
            if key is not None:
                self._unheld.append(key)
        self._unheld.extend(copy.key for copy in copies)
        run.waiting = collections.deque(t for t in run.waiting if t.index not in mine)
        run.suspects = [t for t in run.suspects if t.index not in mine]

    # -- submitting --------------------------------------------------------------------

    def _key(self, run: Launch, task: Task) -> str:
        return f"{self._job_prefix}{self._token}-{task.index}-{run.attempts[task.index]}"

    def _refill(self, run: Launch) -> None:
        """Submit the run's next tasks while fewer than half its window are in flight:
        the scheduler holds a bounded number of them, and a stopped run cancels few."""
        if not run.waiting or len(run.futures) > run.window // 2:
            return
        while run.waiting and len(run.futures) < run.window:
            count = min(SUBMIT_BATCH, run.window - len(run.futures), len(run.waiting))
            self._submit(run, [run.waiting.popleft() for _ in range(count)])

    def _call(self, count: int, again: bool) -> TaskCall:
        store_url = self.store.url if self.store is not None else None
        return TaskCall(self._workload.for_tasks(count), store_url, self.profile,
                        self._topic.topic, self._token, again, self.code)  # fmt: skip

    def _submit(self, run: Launch, tasks: list[Task], *, again: bool = False) -> None:
        if not tasks:
            return
        call = self._call(len(tasks), again)  # (may ship the workload: a call, ungated)
        with self._gate:
            if not self._closing:
                self._submit_batches(run, tasks, call)

    def _submit_batches(self, run: Launch, tasks: list[Task], call: TaskCall) -> None:
        for first in range(0, len(tasks), SUBMIT_BATCH):
            batch = tasks[first : first + SUBMIT_BATCH]
            # Each batch after the one before: Dask orders the tasks of one submission,
            # and puts submissions less than 100 ms apart level, so the first task of
            # every batch went before the second of any (a run's last, short tasks
            # before its long ones). Copies (stragglers.COPY_PRIORITY) still go first.
            self._batches += 1
            futures = self.client.map(
                run_task,
                batch,
                [call] * len(batch),
                key=[self._key(run, t) for t in batch],
                pure=False,
                priority=-self._batches,
            )
            keys = [f.key for f in futures]
            lease.hold(self.client, self._holder, keys)
            # A task submitted again under a new key: its old key is held no more.
            self._unheld.extend(old for t, key in zip(batch, keys, strict=True)
                                if (old := run.keys.get(t.index)) not in (None, key))  # fmt: skip
            run.keys.update(zip((t.index for t in batch), keys, strict=True))
            run.futures.update(zip((t.index for t in batch), futures, strict=True))

    # -- receiving ---------------------------------------------------------------------

    def _finish(self, run: Launch) -> None:
        """Let go of ``run`` (its receipts read, or no more): its tasks not heard from
        cancelled with their copies, its futures released."""
        self._drop(run, set(run.pending))
        self._launches = [r for r in self._launches if r is not run]
        for future in run.futures.values():
            future.release()
        run.futures.clear()
        self._copies.forget(run)

    def _suspect_alone(self, run: Launch) -> None:
        """Once the others are done, a task Dask gave up on runs again, alone, in turn."""
        if run.suspects and not run.waiting and set(run.pending) == {t.index for t in run.suspects}:
            task = run.suspects.pop(0)
            run.attempts[task.index] += 1
            self._submit(run, [task])

    def _pump(self) -> None:
        """Route the next receipt to its run, waiting for it at most :data:`CHECK_SECONDS`;
        look at the futures every :data:`CHECK_SECONDS` (the cluster failing under us)."""
        if INTERRUPTED.is_set():
            # A Ctrl-C whose KeyboardInterrupt was raised inside a callback that
            # swallows what it raises (a garbage collector's): raised here instead.
            raise KeyboardInterrupt
        try:
            message = self._inbox.get(timeout=CHECK_SECONDS)
        except queue.Empty:
            message = None
        if message is not None:
            self._accept(decode(message))
        for run in self._launches:
            self._refill(run)
        self._let_go()
        now = time.monotonic()
        if now - self._checked >= CHECK_SECONDS:
            self._checked = now
            self._check()

    def _accept(self, receipt: TaskReceipt) -> None:
        run = self._owner.get(receipt.index)
        if run is None or receipt.index not in run.pending:
            return  # (a task's second receipt: run again after its worker was lost)
        self._done(run, receipt)

    def _let_go(self) -> None:
        """Let go of the holds on the tasks whose receipts came (their results, None, can
        leave the workers' memory)."""
        if self._unheld:
            lease.release(self.client, self._holder, list(self._unheld))
            self._unheld.clear()

    def _done(self, run: Launch, receipt: TaskReceipt) -> None:
        key = run.keys.pop(receipt.index, None)
        first = [key] if key is not None else []
        self._unheld += self._copies.settle(run, receipt.index, receipt.seconds, first)
        del run.pending[receipt.index]
        self._owner.pop(receipt.index, None)
        run.unreceipted.pop(receipt.index, None)
        future = run.futures.pop(receipt.index, None)
        if future is not None:
            future.release()
        run.ready.append(receipt)

    # -- what Dask reports -------------------------------------------------------------

    def _check(self) -> None:
        if self.client.status != "running":
            self._reconnected()
            return
        self._workerless.check(WORKERLESS_SECONDS)
        for run in list(self._launches):
            for index, future in list(run.futures.items()):
                if index not in run.pending:
                    continue
                status = future.status
                if status == "error":
                    self._given_up(run, run.pending[index], future.exception())
                elif status == "cancelled":
                    if run.generation < self._generation:
                        continue  # submitted again after the reconnection already
                    self._reconnected()
                    return
                elif status == "finished":
                    self._unreceipted(run, run.pending[index])
        self._copies.check(self._launches, self._threads)  # backups, lost tasks' copies

    def _given_up(self, run: Launch, task: Task, error: BaseException) -> None:
        """A task Dask gave up on: run again (alone, if its workers died), or failed."""
        del run.futures[task.index]
        if self._copies.promote(run, task.index):
            return  # a copy of it on the cluster takes its place
        killed = type(error).__name__ == "KilledWorker"
        if killed:
            run.named[task.index] += 1
            if run.named[task.index] <= SUSPECT_RETRIES:
                run.suspects.append(task)
                log.warning(
                    "task %d (units %d..%d): the workers running it died (%s); it runs "
                    "again alone after the others", task.index, task.start, task.stop - 1,
                    type(error).__name__,
                )  # fmt: skip
                return
        elif run.retries[task.index] < DASK_LEVEL_RETRIES:
            run.retries[task.index] += 1
            run.attempts[task.index] += 1
            log.warning("task %d failed on the cluster (%s: %s); submitting it again",
                        task.index, type(error).__name__, error)  # fmt: skip
            self._submit(run, [task])
            return
        log.warning(
            "task %d (units %d..%d) failed on the cluster (%s); its units are failed in "
            "this run, and the next tries it again", task.index, task.start, task.stop - 1,
            type(error).__name__,
        )  # fmt: skip
        self._done(run, killed_receipt(error, task) if killed else failed_receipt(task, error))

    def _unreceipted(self, run: Launch, task: Task) -> None:
        """A task Dask says finished, whose receipt has not come: looked for in the
        scheduler's log of the topic, then submitted again (its stored entry, if any,
        is its receipt)."""
        now = time.monotonic()
        since = run.unreceipted.setdefault(task.index, now)
        if now - since < RECEIPT_GRACE:
            return
        self._catch_up()
        if task.index in run.pending and now - since >= 2 * RECEIPT_GRACE:
            log.warning("task %d finished without a receipt; submitting it again", task.index)
            del run.futures[task.index]
            run.unreceipted.pop(task.index, None)
            run.attempts[task.index] += 1
            self._submit(run, [task], again=True)

    def _take_inbox(self) -> None:
        """Route every receipt already in the inbox to its run, waiting for none."""
        with contextlib.suppress(queue.Empty):
            while True:
                self._accept(decode(self._inbox.get_nowait()))

    def _catch_up(self) -> None:
        self._topic.catch_up()
        self._take_inbox()
        pending = {i: t for run in self._launches for i, t in run.pending.items()}
        for receipt in stored_receipts(self.store, self.workload.job_id, self._token, pending):
            self._accept(receipt)

    def _reconnected(self) -> None:
        """Wait for the client to reconnect, catch up and submit the tasks not heard
        from again; a ClusterError when it cannot reconnect."""
        deadline = time.monotonic() + reconnect_seconds(self.client)
        if self.client.status != "running":
            log.warning("lost the connection to the scheduler at %s; waiting for it",
                        self.client.scheduler.address)  # fmt: skip
        while self.client.status != "running":
            if self.client.status in ("closing", "closed") or time.monotonic() > deadline:
                raise ClusterError(
                    f"lost the connection to the Dask scheduler at "
                    f"{self.client.scheduler.address} in the middle of the run, and it did "
                    "not come back (the scheduler or the way to it failed; every task "
                    "that completed is stored): when the scheduler is reachable, run the "
                    "same command again: it resumes where this run stopped"
                )
            time.sleep(0.1)
        send_promptly(self.client)
        lease.ensure_lease(self.client, reconnect_seconds(self.client) + 10.0, again=True)
        self._topic.resubscribe()
        self._catch_up()
        self._generation += 1
        again = 0
        for run in self._launches:
            run.generation = self._generation
            queued = set(run.waiting)
            tasks = [t for t in run.pending.values() if t not in run.suspects and t not in queued]
            for t in tasks:
                run.futures.pop(t.index, None)
            self._copies.forget(run)
            self._submit(run, tasks, again=True)
            again += len(tasks)
        log.warning("reconnected to the scheduler; %d tasks not heard from submitted again "
                    "(those running or done meanwhile are not run twice)", again)  # fmt: skip
