"""The driver: runs a batch of jobs on one cluster connection (the embedded cluster or a
scheduler's), with their reports, profiles and summaries."""

from __future__ import annotations

import collections
import contextlib
import cProfile
import time
from collections.abc import Sequence
from pathlib import Path

from .cluster.connect import ClusterStart, connect, worker_threads
from .config import (
    RunOptions,
    names_in_scope,
)
from .contract import preflight
from .costs.prices import worker_price
from .errors import ConfigError, Interrupted, InterruptedBeforeTasks
from .jobs import Job, check_driver_paths, check_inputs_outside, naming_file
from .layout import check_job_id, consolidated_manifest_key
from .report import write_report_page
from .runner import check_batch_space, completed_job, only_finalization_left, run_validated_job
from .storage import open_store
from .summary import RunSummary, size
from .workload import Workload

__all__ = ["run_jobs", "run_workload"]


def run_jobs(
    jobs: Sequence[Job], *, echo=print, on_summary=None, started: float | None = None
) -> list[RunSummary]:
    """Run jobs in sequence on one cluster connection (that of the first job).

    Every job's inputs are validated before any task runs, so a bad second job fails
    the batch before the first one has spent an hour. The cluster starts meanwhile,
    unless every job's output looks complete already: a batch whose jobs are all
    complete starts no cluster at all. ``on_summary(job, summary)`` is called as each
    job ends (the last one's once the cluster has stopped), so that a job's summary is
    told even if a later one fails. ``started``: when the command started (the
    interpreter's start), on :func:`time.perf_counter`'s clock: the first job's
    summary counts the whole command's wall time from there.

    Ctrl-C before any task raises :class:`InterruptedBeforeTasks`; during a job,
    :class:`pipeline.errors.Interrupted`.
    """
    return BatchRun(jobs, echo, on_summary, started).run()


class BatchRun:
    """One command's jobs, run phase by phase on one cluster: :meth:`build` (each job's
    workload), :meth:`validate` (their inputs, prices and outputs, while the cluster
    starts), then :meth:`run_on` the cluster, each job's summary told as it ends."""

    def __init__(self, jobs: Sequence[Job], echo=print, on_summary=None, started=None):
        self.t_begin = time.perf_counter()
        self.began = min(started, self.t_begin) if started is not None else self.t_begin
        self.jobs, self.echo, self.on_summary = jobs, echo, on_summary
        self.first = jobs[0].options  # (the jobs share its cluster settings)
        self.several = len(jobs) > 1
        self.workloads: list[Workload] = []
        self.prices: list = []  # each job's worker price, checked once
        #: Each job's summary where it is complete (or finalized without a cluster).
        self.finished: list[RunSummary | None] = []
        self.ready: list[int] = []  # the jobs whose cluster set-up ran in the cluster's start
        self.startup: dict[str, float] = {}  # the command's seconds before the first task

    def run(self) -> list[RunSummary]:
        """The batch checked, built and validated, then run unless every job is complete."""
        _check_one_cluster(self.jobs)
        _check_profile_paths(self.jobs)
        self.build()
        looks_done = [_looks_complete(w, j.options) for j, w in self._pairs()]
        start = None if all(looks_done) else self.start_cluster(looks_done)
        try:
            self.validate()
        except BaseException:
            if start is not None:
                # Closed here, before the error is shown: a cluster closed while the
                # interpreter exits has its workers print tracebacks of lost heartbeats.
                start.close()
            raise
        if all(s is not None for s in self.finished):
            if start is not None:
                start.close()
            for job, summary in zip(self.jobs, self.finished, strict=True):
                self._tell(job, summary)
            return self.finished
        if start is None:
            start = self.start_cluster([done is not None for done in self.finished])
        return self.run_on(start)

    def build(self) -> None:
        """Each job's workload (writing any default inputs), its paths checked."""
        with _before_tasks("setting up the jobs (writing any default inputs)"):
            for job in self.jobs:
                with naming_file(job.source, self.several):
                    check_driver_paths(job.options, job.job_id)
                    self.workloads.append(job.build())
                    check_inputs_outside(self.workloads[-1], job.options)
        self.startup["python start"] = self.t_begin - self.began
        self.startup["job set-up"] = time.perf_counter() - self.t_begin

    def start_cluster(self, done: list[bool]) -> ClusterStart:
        """The cluster started, set up for the jobs not ``done``: the workers import
        every job's modules and reach every job's inputs and output."""
        workloads = self.workloads
        modules = tuple(dict.fromkeys(m for w in workloads for m in w.worker_modules))
        urls = [u for w in workloads for u in w.input_urls()]
        urls += [job.options.output for job, w in self._pairs() if w.writes_output]
        pending = [n for n, job_done in enumerate(done) if not job_done]
        set_up = self._set_up(pending)
        return ClusterStart(self.first, modules, tuple(dict.fromkeys(urls)), set_up)

    def validate(self) -> None:
        """Each job's inputs (``preflight``), price and output store, once; the jobs
        whose tasks are all done finalized here, with no cluster; the space the others
        need."""
        with _before_tasks("checking the inputs"):
            t0 = time.perf_counter()
            for job, workload in self._pairs():
                with naming_file(job.source, self.several):
                    preflight(workload)
                    # A bad instance type or price file, before any task
                    self.prices.append(worker_price(job.options))
                    if workload.writes_output:
                        open_store(job.options.output).preflight()
            for job, workload in self._pairs():
                with naming_file(job.source, self.several):
                    self.finished.append(completed_job(workload, job.options))
            # (a complete job writes nothing more: its record and manifest were just read)
            writing = zip(self.jobs, self.workloads, self.finished, strict=True)
            check_batch_space([(w, job.options) for job, w, done in writing if done is None])
            self.startup["inputs checked"] = time.perf_counter() - t0

    def run_on(self, start: ClusterStart) -> list[RunSummary]:
        """The jobs not complete run on ``start``'s cluster, one after another; each
        summary told as its job ends, the last one's once the cluster has stopped."""
        summaries: list[RunSummary] = []
        stopping = None  # (the last job's summary, and when the cluster's stop began)
        try:
            with start, _profiled(self.first.profile):
                client = self._client(start)
                for n, (job, workload) in enumerate(self._pairs()):
                    summary = self.finished[n]  # (complete, or finalized without a cluster)
                    if summary is None:
                        summary = self._run_one(n, job, workload, client)
                    if self.startup:
                        summary.add_startup(self.startup)
                        summary.count_command(time.perf_counter() - self.began)
                        self.startup = {}
                    summaries.append(summary)
                    if n == len(self.jobs) - 1:
                        stopping = (job, summary, time.perf_counter())
                        break
                    self._tell(job, summary)
        finally:
            if stopping is not None:
                # Told once the cluster has stopped: its stop is part of the command's time
                job, summary, t_stop = stopping
                summary.shutdown_seconds = time.perf_counter() - t_stop
                summary.count_command(summary.command_seconds + summary.shutdown_seconds)
                self._tell(job, summary)
        return summaries

    def _set_up(self, pending: list[int]):
        """The cluster's set-up for the ``pending`` jobs, run in its start thread beside
        the input checks: each job's ``prepare_cluster`` (its code shipped to every
        worker, what they must import checked: a round trip to every worker, seconds on
        a fleet), so that the first task need not wait for it. Only on a cluster that
        has a worker already (the checks need one to answer; the runner waits for one);
        ``ready`` gets each job set up."""

        def set_up(client) -> None:
            if not worker_threads(client):
                return
            for n in pending:
                with naming_file(self.jobs[n].source, self.several):
                    self.workloads[n].prepare_cluster(client)
                self.ready.append(n)

        return set_up

    def _client(self, start: ClusterStart):
        """The started cluster's client, once it is up (the wait counted)."""
        t1 = time.perf_counter()
        with _before_tasks("starting the cluster"):
            client = start.client()
        self.startup["cluster start"] = start.seconds
        self.startup["worker imports"] = start.import_seconds
        self.startup["cluster set-up"] = start.set_up_seconds
        self.startup["waited for the cluster"] = time.perf_counter() - t1
        if not self.first.scheduler and self.first.dashboard and client.dashboard_link:
            self.echo(f"dashboard: {client.dashboard_link}")
        return client

    def _run_one(self, n: int, job: Job, workload: Workload, client) -> RunSummary:
        self.echo(f"{_first_line(workload)} on {_cluster_name(client)}")
        with _performance_report(job.options.report, job.job_id):
            # (its checks ran in validate, once: run_validated_job skips them)
            return run_validated_job(
                workload, job.options, client, self.prices[n], echo=self.echo,
                store_checked=True, cluster_ready=n in self.ready,
            )  # fmt: skip

    def _tell(self, job: Job, summary: RunSummary) -> None:
        """A job's summary told: its report written, ``on_summary`` called."""
        _write_report(job.options, job.job_id, summary, self.echo)
        if self.on_summary:
            self.on_summary(job, summary)

    def _pairs(self):
        return zip(self.jobs, self.workloads, strict=True)


@contextlib.contextmanager
def _before_tasks(during: str):
    """Ctrl-C in this part of a batch's start-up: said as such (no task ran)."""
    try:
        yield
    except KeyboardInterrupt as exc:
        if isinstance(exc, (Interrupted, InterruptedBeforeTasks)):
            raise
        raise InterruptedBeforeTasks(during) from None


def _write_report(options: RunOptions, job_id: str, summary: RunSummary, echo) -> None:
    """The run's summary (JSON) and report page, with ``--report``; a job found
    complete ran nothing to report on, and says so."""
    if not options.report:
        return
    if summary.complete and not summary.units_run:
        echo(f"  no report for job {job_id!r} in {options.report}: it was complete "
             "and nothing ran (--overwrite runs it again)")  # fmt: skip
        return
    Path(options.report).mkdir(parents=True, exist_ok=True)
    page = Path(options.report, f"{job_id}-report.html")
    summary.report = str(page.resolve())
    Path(options.report, f"{job_id}-summary.json").write_text(summary.to_json())
    write_report_page(summary, page)


#: Run settings of the connection to a cluster (or of the embedded one it starts).


#: Run settings of the cluster, not of a job: the jobs of one run share the first's.
CLUSTER_SETTINGS = names_in_scope(RunOptions, "cluster")


def _check_one_cluster(jobs: Sequence[Job]) -> None:
    """A later job file's cluster settings were silently ignored (the run used the
    first job's cluster), so the order of the files decided how the run went."""
    first = jobs[0]
    for job in jobs[1:]:
        for name in CLUSTER_SETTINGS:
            mine, theirs = getattr(job.options, name), getattr(first.options, name)
            if mine != theirs:
                raise ConfigError(
                    f"{job.source or job.job_id}: {name} = {mine!r}, but the jobs of one run "
                    f"share one cluster, the first job's ({first.source or first.job_id}: "
                    f"{name} = {theirs!r}); give --{name.replace('_', '-')} for all of them, "
                    "or run this job on its own"
                )


def _check_profile_paths(jobs: Sequence[Job]) -> None:
    """Several jobs' task profiles to one file without ``{job}``: each job's would
    replace the last one's, unsaid."""
    paths = collections.Counter(j.options.profile_tasks for j in jobs if j.options.profile_tasks)
    shared = [p for p, n in paths.items() if n > 1 and "{job}" not in p]
    if shared:
        raise ConfigError(
            f"--profile-tasks {shared[0]}: {paths[shared[0]]} jobs would write it, each over "
            "the last; put {job} in the name (e.g. prof/{job}.pstats)"
        )


def _looks_complete(workload: Workload, options: RunOptions) -> bool:
    """Whether the job's output holds its consolidated results, or every task's entry
    with only the consolidation left (cheap checks: whether they are current is for
    :func:`completed_job`, after validation)."""
    if not workload.writes_output or options.overwrite:
        return False
    try:
        store = open_store(options.output)
        if store.exists(consolidated_manifest_key(workload.job_id)):
            return True
        return only_finalization_left(workload, options, store)
    except Exception:  # a bad output: validation says what is wrong with it
        return True


def _cluster_name(client) -> str:
    n = sum(client.ncores().values())
    return f"{client.scheduler.address} ({n} worker threads)"


@contextlib.contextmanager
def _performance_report(report_dir: str | None, job_id: str):
    if not report_dir:
        yield
        return
    from distributed import performance_report

    Path(report_dir).mkdir(parents=True, exist_ok=True)
    with performance_report(filename=str(Path(report_dir, f"{job_id}-dask-report.html"))):
        yield


@contextlib.contextmanager
def _profiled(path: str | None):
    if not path:
        yield
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(path)


def run_workload(workload: Workload, options: RunOptions, *, client=None, echo=None,
                 started: float | None = None):  # fmt: skip
    """Run one workload built in Python (not from a job file): on ``client``'s cluster,
    or on an embedded one started for it unless the job is complete already.
    ``started``: when the call began (:func:`time.perf_counter`), if before this one
    (building the workload): the summary counts the call's whole wall time from there."""
    echo = echo or (lambda message: None)
    t0 = time.perf_counter()
    began = min(started, t0) if started is not None else t0
    check_job_id(workload.job_id)
    check_driver_paths(options, workload.job_id)
    check_inputs_outside(workload, options)
    preflight(workload)
    finished = completed_job(workload, options)
    if finished is None:
        price = worker_price(options)
        t_checked = time.perf_counter()
        # The report and the driver's profile, written as `pipeline run` writes them
        # (their paths are checked above)
        with contextlib.ExitStack() as stack, _profiled(options.profile):
            if client is None:
                client = stack.enter_context(connect(options))
            startup = {
                "job set-up": t0 - began,
                "inputs checked": t_checked - t0,
                "waited for the cluster": time.perf_counter() - t_checked,
            }
            echo(f"{_first_line(workload)} on {_cluster_name(client)}")
            with _performance_report(options.report, workload.job_id):
                # (the output store's preflight is the run's: a complete job's output
                # is only read)
                finished = run_validated_job(workload, options, client, price, echo=echo)
            finished.add_startup(startup)
            t_stop = time.perf_counter()
        # The call's whole wall time: the cluster's start-up and stop (when it started one)
        finished.shutdown_seconds = time.perf_counter() - t_stop
        finished.count_command(time.perf_counter() - began)
    _write_report(options, workload.job_id, finished, echo)
    return finished


def _first_line(workload: Workload) -> str:
    """The run's first line: the workload's description, and the bytes it will write
    when that is known before it runs."""
    nbytes = workload.output_bytes(workload.n_units) if workload.writes_output else None
    return workload.describe() + (f" ({size(nbytes)} of output)" if nbytes else "")
