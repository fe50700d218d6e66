"""Jobs: from job files, flags and env vars to workloads, and running a batch of them."""

from __future__ import annotations

import collections
import contextlib
import cProfile
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import registry
from .cluster.connect import ClusterStart, connect
from .config import (
    ENV_PREFIX,
    JobFile,
    ProcessSettings,
    RunOptions,
    check_flags_apply,
    check_unknown_keys,
    load_job_file,
    resolve,
    settings_of,
)
from .contract import preflight
from .costs.prices import worker_price
from .errors import ConfigError, PipelineError
from .layout import check_job_id, consolidated_manifest_key, inside_job_folder, reads_below
from .report import write_report_page
from .runner import check_batch_space, completed_job, run_job
from .storage import open_store
from .storage.globs import has_magic
from .summary import RunSummary
from .workload import Workload
from .workloads.map.usercode import add_import_paths

log = logging.getLogger(__name__)

__all__ = ["Job", "load_jobs", "run_jobs"]


@dataclass(frozen=True)
class Job:
    """One resolved job: how to run it, its workload settings, and its id."""

    workload: str
    options: RunOptions
    settings: Any
    job_id: str
    source: Path | None

    def build(self) -> Workload:
        return registry.load(self.workload).from_settings(self.settings, self.job_id, self.options)


def load_jobs(
    paths: Sequence[str],
    cli: Mapping[str, Any],
    *,
    workload: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Job]:
    """Resolve each job file (or, with none, one job from flags alone) into a :class:`Job`."""
    environ = os.environ if environ is None else environ
    # Users' own modules (a map job's function) import from the job file's folder and
    # the current directory, on the driver and on the embedded cluster's workers.
    add_import_paths(*(Path(p).parent for p in paths), os.getcwd())
    # The workload resolves as settings do: --workload (a job from flags alone) or the
    # job file's key, then PIPELINE_WORKLOAD, then the default.
    default = _workload_from(environ)
    files = [load_job_file(p, default) for p in paths] or [JobFile(None, workload or default, {})]
    jobs = []
    for jf in files:
        with _naming_file(jf.path, len(files) > 1):
            kind = jf.workload
            settings_cls = registry.load(kind).settings_class
            if jf.path is not None:
                check_unknown_keys(jf, RunOptions, settings_cls, owners=_workloads_with)
            check_flags_apply(cli, kind, RunOptions, settings_cls)
            options = resolve(RunOptions, jf, cli, environ)
            settings = resolve(settings_cls, jf, cli, environ)
            job_id = settings.name or jf.stem or kind
            check_job_id(job_id)
        jobs.append(Job(kind, options, settings, job_id, jf.path))
    _check_distinct(jobs)
    _warn_misspelled_variables(environ, [type(job.settings) for job in jobs])
    return jobs


#: The variable naming the workload of a job that does not name one.
WORKLOAD_VARIABLE = f"{ENV_PREFIX}WORKLOAD"


def _workload_from(environ: Mapping[str, str]) -> str:
    name = environ.get(WORKLOAD_VARIABLE, "").strip()
    if not name:
        return registry.DEFAULT_WORKLOAD
    if name not in registry.names():
        raise ConfigError(
            f"environment {WORKLOAD_VARIABLE}: {name!r} is not a workload, expected one of "
            f"{', '.join(registry.names())}"
        )
    return name


def _workloads_with(keys: set[str]) -> list[str]:
    """Registered workloads whose settings include every one of ``keys`` (a job file
    that forgot its ``workload = ...``)."""
    found = []
    for name in registry.names():
        try:
            cls = registry.load(name).settings_class
        except ConfigError:
            continue  # a broken plug-in: its own error when it is asked for
        if keys <= {f.name for f in settings_of(cls)}:
            found.append(name)
    return found


def _check_distinct(jobs: list[Job]) -> None:
    """Two jobs of one command writing one job folder: the second would find the
    first's output (and refuse its other settings, or call itself complete), after the
    first had run."""
    seen: dict[tuple[str, str], Job] = {}
    for job in jobs:
        out = job.options.output
        where = (out.rstrip("/") if "://" in out else os.path.abspath(out), job.job_id)
        if where in seen:
            first = seen[where]
            if first.source == job.source:
                raise ConfigError(f"job file {job.source} is given twice")
            raise ConfigError(
                f"job files {first.source} and {job.source} both write job {job.job_id!r} to "
                f"{out}: give one a name of its own (name = ...) or another output"
            )
        seen[where] = job


def _warn_misspelled_variables(environ: Mapping[str, str], loaded: list[type]) -> None:
    """A ``PIPELINE_*`` variable that is no setting but nearly spells one is a typo
    that would otherwise pass unnoticed (``PIPELINE_WORKRES=4`` runs on every core).
    ``loaded``: the jobs' settings classes; the other workloads' are imported only for
    a variable none of these knows (the regressions' import costs 0.1 s)."""
    import difflib

    def names(classes) -> set[str]:
        return {f.name.upper() for cls in classes for f in settings_of(cls)}

    known = names([RunOptions, ProcessSettings, *loaded]) | {WORKLOAD_VARIABLE[len(ENV_PREFIX) :]}
    unknown = [v for v in sorted(environ)
               if v.startswith(ENV_PREFIX) and v[len(ENV_PREFIX) :] not in known]  # fmt: skip
    if not unknown:
        return
    for name in registry.names():
        try:
            known |= names([registry.load(name).settings_class])
        except ConfigError:  # a plug-in that does not import: said when it is used
            continue
    for var in unknown:
        if var[len(ENV_PREFIX) :] in known:
            continue
        close = difflib.get_close_matches(var[len(ENV_PREFIX) :], known, n=1, cutoff=0.8)
        if close:
            log.warning(
                "environment variable %s is not a setting (did you mean %s%s?); ignored",
                var, ENV_PREFIX, close[0],
            )  # fmt: skip


def run_jobs(jobs: Sequence[Job], *, echo=print, on_summary=None) -> list[RunSummary]:
    """Run jobs in sequence on one cluster connection (that of the first job).

    Every job's inputs are validated before any task runs, so a bad second job fails
    the batch before the first one has spent an hour. The cluster starts meanwhile,
    unless every job's output looks complete already: a batch whose jobs are all
    complete starts no cluster at all. ``on_summary(job, summary)`` is called as each
    job ends, so that a job's summary is told even if a later one fails.
    """
    first = jobs[0].options
    _check_one_cluster(jobs)
    _check_profile_paths(jobs)
    several = len(jobs) > 1
    workloads = []
    for job in jobs:
        with _naming_file(job.source, several):
            check_driver_paths(job.options, job.job_id)
            workloads.append(job.build())
            check_inputs_outside(workloads[-1], job.options)
    modules = tuple(dict.fromkeys(m for w in workloads for m in w.worker_modules))
    urls = [u for w in workloads for u in w.input_urls()]
    urls += [job.options.output for job, w in zip(jobs, workloads, strict=True) if w.writes_output]
    urls = tuple(dict.fromkeys(urls))
    start = None
    if not all(_looks_complete(w, job.options) for job, w in zip(jobs, workloads, strict=True)):
        start = ClusterStart(first, modules, urls)
    try:
        t0 = time.perf_counter()
        for job, workload in zip(jobs, workloads, strict=True):
            with _naming_file(job.source, several):
                preflight(workload)
                worker_price(job.options)  # a bad instance type or price file, before any task
                if workload.writes_output:
                    open_store(job.options.output).preflight()
        finished = []
        for job, workload in zip(jobs, workloads, strict=True):
            with _naming_file(job.source, several):
                finished.append(completed_job(workload, job.options))
        # (a complete job writes nothing: its record and manifest were just read)
        writing = zip(jobs, workloads, finished, strict=True)
        check_batch_space([(w, job.options) for job, w, done in writing if done is None])
        validation_seconds = time.perf_counter() - t0
    except BaseException:
        if start is not None:
            # Closed here, before the error is shown: a cluster closed while the
            # interpreter exits has its workers print tracebacks of lost heartbeats.
            start.close()
        raise
    if all(s is not None for s in finished):
        if start is not None:
            start.close()
        for job, summary in zip(jobs, finished, strict=True):
            _write_report(job.options, job.job_id, summary, echo)
            if on_summary:
                on_summary(job, summary)
        return finished
    summaries = []
    with start or ClusterStart(first, modules, urls) as start, _profiled(first.profile):
        t1 = time.perf_counter()
        client = start.client()
        startup = {
            "inputs checked": validation_seconds,
            "cluster start": start.seconds,
            "worker imports": start.import_seconds,
            "waited for the cluster": time.perf_counter() - t1,
        }
        if not first.scheduler and first.dashboard and client.dashboard_link:
            echo(f"dashboard: {client.dashboard_link}")
        for job, workload in zip(jobs, workloads, strict=True):
            echo(f"{workload.describe()} on {_cluster_name(client)}")
            with _performance_report(job.options.report, job.job_id):
                summary = run_job(workload, job.options, client, echo=echo)
            summary.cluster_seconds = startup.get("waited for the cluster", 0.0)
            summary.startup, startup = startup, {}
            _write_report(job.options, job.job_id, summary, echo)
            summaries.append(summary)
            if on_summary:
                on_summary(job, summary)
    return summaries


@contextlib.contextmanager
def _naming_file(source: Path | None, several: bool):
    """An error about one of several jobs names its job file (``badb.toml: function
    fits:fit_one(alpha, n, seed) does not accept the grid key(s) 'm'``): the message
    alone did not say which file to fix."""
    try:
        yield
    except PipelineError as exc:
        if several and source is not None and str(source) not in str(exc):
            exc.args = (f"{source}: {exc}",)
        raise


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
    Path(options.report, f"{job_id}-summary.json").write_text(summary.to_json())
    write_report_page(summary, Path(options.report, f"{job_id}-report.html"))


def check_driver_paths(options: RunOptions, job_id: str) -> None:
    """The report folder and the profile files can be written: found out before any
    task runs, not after the last one (a task profile's error would also leave the job
    without its consolidated manifest)."""
    wanted = [("report", options.report, True), ("profile", options.profile, False)]
    if options.profile_tasks:
        wanted.append(("profile_tasks", options.profile_tasks.replace("{job}", job_id), False))
    for name, value, folder in wanted:
        if not value:
            continue
        problem = _unwritable(Path(value).expanduser(), folder)
        if problem:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{name} = {value!r} ({flag}): {problem}")


def check_inputs_outside(workload: Workload, options: RunOptions) -> None:
    """An input inside the job's own folder would be deleted by ``--overwrite`` (and
    counted by ``verify`` as objects that are none of the job's); an output inside an
    input would be read by the job's next run, its results as inputs (and a resume
    refused: its inputs changed)."""
    if not workload.writes_output:
        return
    output = options.output.rstrip("/")
    for url in workload.input_urls():
        if inside_job_folder(url, options.output, workload.job_id):
            raise ConfigError(
                f"{url}: this input is inside the job's own folder "
                f"({output}/{workload.job_id}), which --overwrite empties; "
                "move it, or give the job another name (--name)"
            )
        if reads_below(url, options.output):
            where = (
                f"this glob matches files inside the output ({output})"
                if has_magic(url)
                else f"the output ({output}) is inside this input"
            )
            raise ConfigError(
                f"{url}: {where}, so the job's next run would read its results as inputs; "
                "give another output (--output)"
            )


def _unwritable(path: Path, folder: bool) -> str | None:
    """Why ``path`` (a folder, or a file) cannot be written, or None."""
    if path.exists():
        if folder and not path.is_dir():
            return "is a file; a folder is expected (the run's report pages go in it)"
        if not folder and path.is_dir():
            return "is a folder; a file name is expected"
        if not os.access(path, os.W_OK | (os.X_OK if folder else 0)):
            return "cannot be written (permission denied)"
        return None
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot be created: {parent} is a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: no permission to write in {parent}"
    return None


#: Run settings of the connection to a cluster (or of the embedded one it starts).
CONNECTION_SETTINGS = ("scheduler", "workers", "dashboard", "tls_ca_file", "tls_cert", "tls_key",
                       "direct_to_workers")  # fmt: skip
#: Run settings of the cluster, not of a job: the jobs of one run share the first's.
CLUSTER_SETTINGS = (*CONNECTION_SETTINGS, "profile")


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
    """Whether the job's output holds its consolidated results (one cheap check:
    whether they are current is for :func:`completed_job`, after validation)."""
    if not workload.writes_output or options.overwrite:
        return False
    try:
        return open_store(options.output).exists(consolidated_manifest_key(workload.job_id))
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


def run_workload(workload: Workload, options: RunOptions, *, client=None, echo=None):
    """Run one workload built in Python (not from a job file): on ``client``'s cluster,
    or on an embedded one started for it unless the job is complete already."""
    echo = echo or (lambda message: None)
    check_driver_paths(options, workload.job_id)
    check_inputs_outside(workload, options)
    preflight(workload)
    finished = completed_job(workload, options)
    if finished is None:
        # The report and the driver's profile as `pipeline run` writes them: checked
        # above, they were then left unwritten, unsaid
        with contextlib.ExitStack() as stack, _profiled(options.profile):
            if client is None:
                client = stack.enter_context(connect(options))
            with _performance_report(options.report, workload.job_id):
                finished = run_job(workload, options, client, echo=echo)
    _write_report(options, workload.job_id, finished, echo)
    return finished
