"""The scheduler's CPU per task, measured while the probes run (see docs/planning.md).

No tasks of its own: a burst of no-op tasks before the probes held every worker for
seconds on a loaded fleet (4-6 s of a one-minute job at 200-500 simulated workers).
The scheduler process's CPU time is read (``Client.run_on_scheduler``) before the
first probes are submitted and then at most once a :data:`SAMPLE_SECONDS` as their
receipts come. The scheduler spends its CPU on the tasks (their submission, state
transitions, results, receipts and releases) and on the workers' heartbeats, which
go on whatever the tasks do; the probes' tasks end in bursts (the warm-ups, then the
large probes) while time runs evenly, so a least-squares line of the CPU on the time
and on the tasks counted (half a task at its submission, half at its receipt)
separates the two: its slope on the tasks is the figure. Where that fit fails (too
few readings, a slope that is not positive), the CPU over the tasks counted, the
heartbeats included: an overestimate, which makes tasks longer, never shorter.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["SchedulerCpu", "cpu_per_task"]

#: Seconds at least between two readings of the scheduler's CPU (each a round trip).
SAMPLE_SECONDS = 0.5
#: Readings the line needs (three unknowns: the start, the heartbeats' rate, per task).
MIN_READINGS = 4


class SchedulerCpu:
    """Readings of the scheduler's CPU against the time and the tasks counted."""

    def __init__(self, client, enabled: bool = True):
        self.client = client
        self.enabled = enabled
        self.tasks = 0.0  # tasks counted: half at submission, half at the receipt
        self.readings: list[tuple[float, float, float]] = []  # (time, tasks, CPU)
        self._last = -float("inf")
        if enabled:
            self.read(force=True)

    def submitted(self, count: int) -> None:
        self.tasks += count / 2

    def reported(self, count: int = 1) -> None:
        self.tasks += count / 2
        self.read()

    def read(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not force and now - self._last < SAMPLE_SECONDS):
            return
        cpu = _scheduler_cpu(self.client)
        if cpu is None:  # the scheduler runs no client's function: not measured
            self.enabled = False
            return
        self._last = now
        self.readings.append((now, self.tasks, cpu))

    def per_task(self) -> float | None:
        """The scheduler's CPU seconds per task (None where not measured)."""
        self.read(force=True)
        return cpu_per_task(self.readings)


def cpu_per_task(readings: list[tuple[float, float, float]]) -> float | None:
    """The CPU per task of ``readings`` (time, tasks counted, CPU seconds): the slope on
    the tasks of a line on the time and the tasks, where that fits (a rate for the
    heartbeats of at least 0, a cost per task above 0 and at most the gross figure);
    else the gross figure, the CPU over the tasks counted; None with no task counted."""
    r = np.array(readings, dtype=float)
    if len(r) < 2 or r[-1, 1] <= r[0, 1]:
        return None
    gross = max(r[-1, 2] - r[0, 2], 0.0) / (r[-1, 1] - r[0, 1])
    if len(r) < MIN_READINGS or np.ptp(r[:, 0]) <= 0:
        return gross
    design = np.column_stack([np.ones(len(r)), r[:, 0] - r[0, 0], r[:, 1]])
    (_start, heartbeats, per_task), *_ = np.linalg.lstsq(design, r[:, 2], rcond=None)
    if heartbeats < 0 or not 0 < per_task <= gross:
        return gross
    return float(per_task)


def _scheduler_cpu(client) -> float | None:
    """The scheduler process's CPU seconds, None where it runs no client's function."""
    try:
        return float(client.run_on_scheduler(time.process_time))
    except Exception:
        return None
