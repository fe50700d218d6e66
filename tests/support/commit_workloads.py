"""A test workload whose tasks wait on a gate and log each start, some of whose units
fail (then its task commits no entry): tests/test_commit_once.py's blip."""

from __future__ import annotations

import os
import time
from pathlib import Path

from support.workloads import SquaresWorkload


class GatedSquares(SquaresWorkload):
    """Squares whose every task logs its start (``log/started-<index>``), then waits for
    the file ``gate`` (at most 120 s); units in ``fail`` fail (TaskOutput.failures)."""

    kind = "gated-squares"

    def __init__(self, job_id, n_units, gate, log, fail=()):
        super().__init__(job_id, n_units, fail=fail)
        self.gate, self.log = str(gate), str(log)

    def run_task(self, task, store):
        with open(Path(self.log) / f"started-{task.index}", "a") as f:
            f.write(f"{os.getpid()}\n")
        deadline = time.monotonic() + 120
        while not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.02)
        return super().run_task(task, store)

    def started(self) -> dict[int, int]:
        """Task index -> how many times it started."""
        return {
            int(p.name.split("-")[1]): len(p.read_text().split())
            for p in Path(self.log).glob("started-*")
        }
