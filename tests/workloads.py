"""Small workloads for testing the runner itself through its public Workload interface."""

from __future__ import annotations

import os
import time

import pyarrow as pa

from pipeline import TaskOutput, UnitFailure, Workload
from pipeline.storage import join


class SquaresWorkload(Workload):
    """Unit i writes i*i; units in ``fail`` raise, a task containing ``crash_task``'s
    first unit raises as a whole, unit ``exit_unit`` kills its worker process, and
    each unit takes at least ``unit_seconds``."""

    kind = "squares"
    unit_name = "square"

    def __init__(self, job_id, n_units, fail=(), crash_task=None, exit_unit=None, unit_seconds=0):
        self.job_id, self.n_units, self.unit_seconds = job_id, n_units, unit_seconds
        self.fail, self.crash_task, self.exit_unit = set(fail), crash_task, exit_unit

    @classmethod
    def from_settings(cls, settings, job_id, options):
        return cls(job_id, settings.n_units)

    def preflight(self):
        pass

    def fingerprint(self):
        return {"n_units": self.n_units}

    def run_task(self, task, store):
        if task.index == self.crash_task:
            raise RuntimeError(f"task {task.index} cannot start")
        out = TaskOutput()
        values = []
        for unit in task.units:
            if unit == self.exit_unit:
                os._exit(3)
            time.sleep(self.unit_seconds)
            try:
                if unit in self.fail:
                    raise ValueError(f"unit {unit} is bad")
                values.append(unit * unit)
                store.write_bytes(join(self.job_id, "values", f"{unit:05d}"), b"%d" % (unit * unit))
            except ValueError as exc:
                out.failures.append(UnitFailure.from_exception(unit, exc))
        out.manifest = pa.table({"value": values})
        return out
