"""Small workloads for testing the runner itself through its public Workload interface,
and the state a run stopped part way leaves."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa

from pipeline import OutputFile, TableResults, TaskOutput, UnitFailure, Workload, checksum
from pipeline.config import setting
from pipeline.storage import join


@dataclasses.dataclass(frozen=True)
class SquaresJob:
    name: str | None = setting(None, str, "Job id.")
    n_units: int = setting(10, int, "Units.", minimum=1)
    fail: str | None = setting(None, str, "Units that raise, comma-separated.", sequence=True)
    preflights: str | None = setting(None, str, "A file each preflight adds the job's name to.")
    preflight_gate: str | None = setting(
        None, str, "A file preflight waits for, once it has made GATE.reached."
    )
    finalize_gate: str | None = setting(
        None, str, "A file finalize waits for, once it has made GATE.reached."
    )


class SquaresResults(TableResults):
    """The default output hooks, but for a finalize that waits at the workload's
    ``finalize_gate`` first."""

    @classmethod
    def finalize(cls, workload, store, tasks):
        _wait_at(workload.finalize_gate)
        return super().finalize(workload, store, tasks)


class SquaresWorkload(Workload):
    """Unit i writes i*i (an object the runner writes, or with ``writes_itself`` one
    the task writes); each preflight adds the job's name to the file ``preflights``
    (when given); units in ``fail`` raise, a task containing ``crash_task``'s
    first unit raises as a whole, unit ``exit_unit`` kills its worker process, and
    each unit takes at least ``unit_seconds`` (unit ``slow[0]``, ``slow[1]`` more; a
    Dask worker's first unit ``cold_seconds`` more)."""

    kind = "squares"
    unit_name = "square"
    settings_class = SquaresJob
    results = SquaresResults

    def __init__(
        self,
        job_id,
        n_units,
        fail=(),
        crash_task=None,
        exit_unit=None,
        unit_seconds=0,
        slow=None,
        writes_itself=False,
        preflights=None,
        cold_seconds=0.0,
    ):
        self.job_id, self.n_units, self.unit_seconds = job_id, n_units, unit_seconds
        self.slow, self.writes_itself, self.preflights = slow, writes_itself, preflights
        self.fail, self.crash_task, self.exit_unit = set(fail), crash_task, exit_unit
        self.cold_seconds = cold_seconds

    @classmethod
    def from_settings(cls, settings, job_id, options=None):
        fail = [int(u) for u in (settings.fail or "").split(",") if u.strip()]
        made = cls(job_id, settings.n_units, fail=fail, preflights=settings.preflights)
        made.preflight_gate, made.finalize_gate = settings.preflight_gate, settings.finalize_gate
        return made

    preflight_gate = finalize_gate = None

    def preflight(self):
        if self.preflights:
            with open(self.preflights, "a") as f:
                f.write(f"{self.job_id}\n")
        _wait_at(self.preflight_gate)

    def fingerprint(self):
        return {"n_units": self.n_units}

    def seconds_of(self, unit: int) -> float:
        return self.unit_seconds + (self.slow[1] if self.slow and unit == self.slow[0] else 0)

    def _cold(self) -> float:
        return self.cold_seconds if self.cold_seconds and _first_call_on_this_worker() else 0.0

    def run_task(self, task, store):
        if task.index == self.crash_task:
            raise RuntimeError(f"task {task.index} cannot start")
        out = TaskOutput()
        for unit in task.units:
            if unit == self.exit_unit:
                os._exit(3)
            time.sleep(self.seconds_of(unit) + self._cold())
            try:
                if unit in self.fail:
                    raise ValueError(f"unit {unit} is bad")
                key, data = join(self.job_id, "values", f"{unit:05d}"), b"%d" % (unit * unit)
                if self.writes_itself:  # the runner reads it back for its checksum
                    store.write_bytes(key, data)
                    data = None
                out.files.append(OutputFile(key, "values", data))
            except ValueError as exc:
                out.failures.append(UnitFailure.from_exception(unit, exc))
        return out


def _wait_at(gate: str | None) -> None:
    """Say this point is reached (the file GATE.reached), then wait for the file GATE."""
    if gate:
        Path(gate + ".reached").touch()
        while not os.path.exists(gate):
            time.sleep(0.01)


#: Dask workers (their addresses) that have run a unit; a worker's executor thread
#: may end when idle and another take its place, so the worker, not the thread.
_WARM_WORKERS: set[str] = set()


def _first_call_on_this_worker() -> bool:
    from distributed import get_worker

    address = get_worker().address
    first = address not in _WARM_WORKERS
    _WARM_WORKERS.add(address)
    return first


class Opaque:
    """An object whose text is its memory address (no ``__repr__``)."""


class MistakenWorkload(SquaresWorkload):
    """Squares with one of a plug-in author's mistakes, ``mistake``: the runner names
    them, where it tripped over them or ran "complete" into a broken output."""

    kind = "mistaken"

    def __init__(self, job_id, n_units, mistake):
        super().__init__(job_id, n_units)
        self.mistake = mistake

    def preflight(self):
        if self.mistake == "no units":
            self.n_units = 0
        elif self.mistake == "a ValueError in preflight":
            raise ValueError("threshold must be positive")
        elif self.mistake == "an unreadable input":
            raise FileNotFoundError(2, "No such file or directory", "inputs/a.csv")

    def fingerprint(self):
        if self.mistake == "an object in the fingerprint":
            return {**super().fingerprint(), "obj": Opaque()}
        return super().fingerprint()

    def run_task(self, task, store):
        out = super().run_task(task, store)
        if self.mistake == "a table named manifest":
            out.tables["manifest"] = pa.table({"x": [1]})
        elif self.mistake == "a list for a table":
            out.tables["values"] = [task.start]
        elif self.mistake == "a file outside the job's folder":
            out.files[0] = OutputFile("elsewhere/x", "values", b"1")
        elif self.mistake == "files whose units overlap":
            more = range(task.start, task.stop + 1)
            out.files = [dataclasses.replace(f, units=more) for f in out.files]
        elif self.mistake == "files and an entry":
            out.manifest = pa.table({"object": [f.key for f in out.files]})
        else:  # a mistake in an entry it builds itself, of the objects it writes itself
            self._own_entry(task, store, out)
        return out

    def _own_entry(self, task, store, out):
        for file in out.files:
            store.write_bytes(file.key, file.data)
        n = len(out.files)
        entry = pa.table({"object": [f.key for f in out.files], "unit_start": [task.start] * n,
                          "unit_stop": [task.stop] * n,
                          "checksum": [checksum(f.data) for f in out.files]})  # fmt: skip
        out.files, out.manifest = [], entry
        if self.mistake == "no manifest entry":
            out.manifest = None
        elif self.mistake == "objects alone":
            out.manifest = entry.select(["object"])
        elif self.mistake == "sha256 checksums":
            digests = [hashlib.sha256(store.read_bytes(k)).hexdigest()
                       for k in entry.column("object").to_pylist()]  # fmt: skip
            out.manifest = entry.set_column(3, "checksum", pa.array(digests))
        elif self.mistake == "overlapping ranges":
            stops = pa.array([task.stop + 1] * entry.num_rows, pa.int64())
            out.manifest = entry.set_column(2, "unit_stop", stops)
        elif self.mistake == "null ranges":
            starts = pa.array([None] * entry.num_rows, pa.int64())
            out.manifest = entry.set_column(1, "unit_start", starts)


class StaticVerifyResults(SquaresResults):
    @staticmethod
    def verify_job(store, job_id, record, manifest, check):
        from pipeline.manifest import check_listed_objects

        return check_listed_objects(store, manifest, check)


class StaticVerifyWorkload(SquaresWorkload):
    """Squares whose verify_job is a staticmethod, as a plug-in may write it (its job
    verified as the squares' are: it is not registered)."""

    results = StaticVerifyResults


def stopped_while_probing(full: Path, out: Path, job_id: str) -> list[int]:
    """A copy at ``out`` of the complete output ``full`` as a driver killed while probing
    leaves it: the probes recorded, the rest not sized, the last probe's entry missing
    and nothing consolidated. Returns the probes' sizes."""
    shutil.copytree(full, out)
    job = out / job_id
    record = json.loads((job / "job.json").read_text())
    record["stops"] = None
    (job / "job.json").write_text(json.dumps(record))
    for part in sorted((job / "manifest").iterdir())[len(record["head"]) - 1 :]:
        part.unlink()
    (job / "manifest.parquet").unlink()
    return record["head"]


class VersionedWorkload(SquaresWorkload):
    """A plug-in whose fingerprint holds its own code's ``version``, a setting it
    declares as code (``code_settings``): a fix may keep the tasks done. (Its
    output is read back, by verify, as the squares' it is.)"""

    code_settings = ("version",)

    def __init__(self, job_id, n_units, version, **kwargs):
        super().__init__(job_id, n_units, **kwargs)
        self.version = version

    def fingerprint(self):
        return {"n_units": self.n_units, "version": self.version}


class KillsItsWorkerOnce(SquaresWorkload):
    """Unit ``kill_unit`` kills its worker the first time only (a lost machine)."""

    def __init__(self, *args, kill_unit, marker, **kw):
        super().__init__(*args, **kw)
        self.kill_unit, self.marker = kill_unit, str(marker)

    def run_task(self, task, store):
        import os

        if self.kill_unit in task.units and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(3)
        return super().run_task(task, store)
