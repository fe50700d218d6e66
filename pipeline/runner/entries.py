"""A run's manifest entries read on the driver while its tasks run, so that the
consolidation at its end (:func:`pipeline.manifest.manifest_entries`) reads only the
entries left: on a fleet's job of thousands of tasks, reading them all at the end
took seconds of the run's wall time (longer on S3, or with the cluster's workers
busy on the same machine) while the driver waited on the tasks with little to do.

An entry is committed once and never overwritten (:mod:`pipeline.dispatch.commit`),
so the entry read as soon as its task reports is the one the consolidation would
read; the consolidation still lists the entries and takes the current one of each
task, read here or not."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping

from ..dispatch.receipts import TaskReceipt
from ..layout import manifest_key
from ..storage import Store, read_parquet_object

__all__ = ["EntriesReadAhead"]

log = logging.getLogger(__name__)


class EntriesReadAhead:
    """Reads the entry of each task whose receipt it is given (:meth:`add`), in a
    thread of its own; :meth:`close` stops it and gives the entries read (a mapping
    of key to ``pyarrow.Table``), what it has not read left for the consolidation.
    The entries are kept a batch to a table: one table of a row each would hold
    kilobytes apiece, a gigabyte at a hundred thousand tasks."""

    def __init__(self, store: Store, job_id: str, rounds: dict[int, int]):
        self.store, self.job_id, self.rounds = store, job_id, rounds
        self.entries = ReadEntries()
        self._keys: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._read, name="pipeline-entries", daemon=True)
        self._thread.start()

    def add(self, receipt: TaskReceipt) -> None:
        """The entry of ``receipt``'s task, to read if it committed one."""
        if receipt.complete and receipt.units:
            round_ = self.rounds.get(receipt.index, 0)
            self._keys.put(manifest_key(self.job_id, receipt.index, round_))

    def _read(self) -> None:
        batch: list[tuple[str, object]] = []
        while (key := self._keys.get()) is not None:
            try:
                batch.append((key, read_parquet_object(self.store, key)))
            except Exception as exc:  # (the consolidation reads it, and says what fails)
                log.debug("entry %s not read ahead: %r", key, exc)
            if len(batch) >= BATCH or (batch and self._keys.empty()):
                self.entries.add(batch)
                batch = []
        self.entries.add(batch)

    def close(self) -> ReadEntries:
        """Stop reading (what is queued is read first); the entries read."""
        if self._thread.is_alive():
            self._keys.put(None)
            self._thread.join()
        return self.entries

    def __enter__(self) -> EntriesReadAhead:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


#: Entries kept in one table.
BATCH = 256


class ReadEntries(Mapping):
    """Entries read, by key: each a slice of the table of its batch."""

    def __init__(self):
        self._tables: list = []
        self._where: dict[str, tuple[int, int, int]] = {}  # key -> (table, row, rows)

    def add(self, batch: list[tuple[str, object]]) -> None:
        if not batch:
            return
        import pyarrow as pa

        table = pa.concat_tables([t for _, t in batch], promote_options="permissive")
        row = 0
        for key, entry in batch:
            self._where[key] = (len(self._tables), row, entry.num_rows)
            row += entry.num_rows
        self._tables.append(table)

    def __getitem__(self, key: str):
        table, row, rows = self._where[key]
        return self._tables[table].slice(row, rows)

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)
