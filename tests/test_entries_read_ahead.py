"""A run reads its tasks' manifest entries while they run (pipeline/runner/entries.py),
and the consolidation takes those rather than reading them again; the manifest is
the same bytes either way."""

from __future__ import annotations

from support.workloads import SquaresWorkload

from pipeline import RunOptions
from pipeline.costs.prices import worker_price
from pipeline.layout import consolidated_manifest_key
from pipeline.manifest import consolidate_manifest, entries_read, entry_keys
from pipeline.runner import JobRun
from pipeline.storage import LocalStore, read_parquet_object


def _run(out, client, fail=()) -> JobRun:
    options = RunOptions(output=str(out), progress=False, units_per_task=3)
    run = JobRun(SquaresWorkload("sq", 40, fail=set(fail)), options, client,
                 worker_price(options), echo=lambda m: None)  # fmt: skip
    run.run()
    return run


def test_a_runs_entries_are_read_while_its_tasks_run(tmp_path, client):
    first = _run(tmp_path / "a", client, fail={7})
    # every task that committed an entry, each read as its receipt came, the same
    # table as the store's
    store = LocalStore(str(tmp_path / "a"))
    keys = entry_keys(store, "sq")
    assert keys and set(first.entries) == set(keys.values())
    for key in keys.values():
        assert first.entries[key].equals(read_parquet_object(store, key))
    # (an entry missed, say of a round the run did not know, is only read at the end:
    # the consolidation lists the entries and takes each task's current one)


def test_the_consolidation_takes_the_entries_read_and_reads_the_rest(tmp_path, client):
    run = _run(tmp_path / "a", client)
    store = LocalStore(str(tmp_path / "a"))
    made = store.read_bytes(consolidated_manifest_key("sq"))
    # the same bytes, consolidated again with half the entries read ahead
    half = dict(list(run.entries.items())[::2])
    with entries_read(half):
        consolidate_manifest(store, "sq", run.tasks)
    assert store.read_bytes(consolidated_manifest_key("sq")) == made
    # and what is given is taken, not read again (an entry given as empty: its rows go)
    key = next(iter(half))
    with entries_read({key: half[key].slice(0, 0)}):
        taken = consolidate_manifest(store, "sq", run.tasks)
    rows = sum(table.num_rows for table in run.entries.values())
    assert half[key].num_rows and taken.num_rows == rows - half[key].num_rows
