"""What bound a run's tasks, from where their time went: the phases a workload reports
(inputs, compute, writing), their CPU time and the time they waited for a core. A run's
summary and an estimate's projections both name it."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PHASES", "TaskTime", "cpu_bound", "phase_bound", "task_bound"]


#: What a task's time is spent on, as workloads report it (worker-seconds).
PHASES = ("inputs", "compute", "writing")


@dataclass(frozen=True)
class TaskTime:
    """Where tasks' time went, summed over them (worker-seconds): what tells a run's
    summary, and an estimate from its probes, what bound the tasks."""

    #: The tasks' busy seconds.
    seconds: float
    #: Seconds by :data:`PHASES`.
    phases: dict[str, float] = field(default_factory=dict)
    #: CPU seconds of the worker processes during the tasks (0: not measured).
    cpu: float = 0.0
    bytes_written: int = 0
    #: Whether they wrote to S3 (else to a disk).
    s3: bool = False
    #: Seconds they were runnable but waiting for a core (None: not measured).
    runq: float | None = None

    @classmethod
    def of(cls, receipts, s3: bool) -> TaskTime:
        """The sums over task receipts (:class:`pipeline.dispatch.receipts.TaskReceipt`)."""
        phases: dict[str, float] = {}
        for r in receipts:
            for phase, value in r.phases.items():
                phases[phase] = phases.get(phase, 0.0) + value
        # (tasks that never ran, or ran where the kernel does not say, are left out)
        queued = [r.runq_seconds for r in receipts if r.runq_seconds is not None]
        return cls(
            seconds=sum(r.busy_seconds for r in receipts),
            phases=phases,
            cpu=sum(r.cpu_seconds for r in receipts),
            bytes_written=sum(r.bytes_written for r in receipts),
            s3=s3,
            runq=sum(queued) if queued else None,
        )


def phase_bound(t: TaskTime, span: float) -> str | None:
    """The phase that bound the tasks: "S3-bound" or "disk-bound" when writing took
    most of their time, "input-bound" when loading inputs did, else None. A phase
    binds when it dominates and fills a quarter of ``span`` at least (a run's wall
    time x its workers): otherwise idle workers say more than how the little busy
    time was split."""
    inputs, compute, writing = (t.phases.get(p, 0.0) for p in PHASES)
    share = 0.25 * span
    if writing > max(compute, inputs, share) and t.bytes_written:
        return "S3-bound" if t.s3 else "disk-bound"
    if inputs > max(compute, writing, share):
        return "input-bound"
    return None


def cpu_bound(t: TaskTime) -> str:
    """Whether the tasks computed: "CPU-bound" when they were on the CPU half their
    time at least; "CPU-contended" when not, but they were runnable and waiting for a
    core most of the rest (the machine's cores busy with other work); else
    "wait-bound" (sleep, network, disk, locks, or that is not measured)."""
    if not t.cpu or t.cpu >= 0.5 * t.seconds:
        return "CPU-bound"
    if t.runq is not None and t.runq >= 0.5 * (t.seconds - t.cpu):
        return "CPU-contended"
    return "wait-bound"


def task_bound(t: TaskTime) -> str:
    """What bound tasks that kept their workers busy (an estimate's probes, the tasks a
    projection hands out): :func:`phase_bound`, else :func:`cpu_bound`."""
    return phase_bound(t, t.seconds) or cpu_bound(t)
