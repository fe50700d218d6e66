"""Which tasks finished while the driver was away, from the store: it does not forget.

Receipts travel as events, and the scheduler keeps only a topic's last
``distributed.admin.low-level-log-length`` events (1,000 by default): after a blip
in which more tasks finished, a driver that reads the log alone misses the rest, and
runs them again. So after a reconnect (and before submitting a silent task again)
the driver also looks in the store, with two listings whatever the number of tasks:

- a task whose entry (of its round) is there is complete: its receipt is made from
  it (without the attempt's timings, which went with the event);
- a task whose attempt failed units commits no entry, so that attempt also leaves
  its receipt in the store (:func:`keep_failed_receipt`), under the run's token,
  which the driver reads back; the run's receipts are removed as it ends
  (:func:`forget_receipts`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging

from ..layout import entry_round, receipt_key, receipts_prefix
from ..manifest import entry_keys
from ..storage import Store
from ..workload import Task
from .receipts import TaskReceipt, decode, encode

__all__ = ["forget_receipts", "keep_failed_receipt", "stored_receipts"]

log = logging.getLogger(__name__)


def keep_failed_receipt(store: Store, job_id: str, token: str, receipt: TaskReceipt) -> None:
    """Worker: store the receipt of an attempt that failed units (it has no entry), for
    the driver to find should its event be lost. A receipt not stored is not an error:
    the event still carries it."""
    message = encode(dataclasses.replace(receipt, profile=None), token)
    try:
        store.write_bytes(receipt_key(job_id, token, receipt.index), json.dumps(message).encode())
    except OSError as exc:
        log.warning("task %d: its receipt was not stored (%s)", receipt.index, exc)


def stored_receipts(
    store: Store | None, job_id: str, token: str, pending: dict[int, Task]
) -> list[TaskReceipt]:
    """The receipts the store holds for the ``pending`` tasks (index -> task): made
    from the entries of those complete, read back for those whose attempt failed
    units."""
    if store is None or not pending:
        return []
    found = []
    entries = entry_keys(store, job_id)
    for index, task in pending.items():
        entry = entries.get(index)
        if entry is not None and entry_round(entry) >= task.round:
            # recorded=None: the run reads the task's recorded failures from its entry
            found.append(TaskReceipt(index, len(task.units), (), 0, 0.0, 0.0, ""))
    complete = {r.index for r in found}
    for key in store.list(receipts_prefix(job_id, token)):
        name = key.rsplit("/", 1)[-1].removesuffix(".json")
        index = int(name) if name.isdigit() else None
        if index in pending and index not in complete:
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                found.append(decode(json.loads(store.read_bytes(key))))
    return found


def forget_receipts(store: Store | None, job_id: str, token: str) -> None:
    """Remove the run's stored receipts (its driver has read or no longer needs them)."""
    if store is not None:
        with contextlib.suppress(OSError):
            store.delete_prefix(receipts_prefix(job_id, token))
