"""``pipeline run`` and ``pipeline estimate``: jobs from files, flags and variables."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys

import click

from .. import registry
from ..driver import run_jobs
from ..errors import Interrupted, InterruptedBeforeTasks
from ..jobs import load_jobs
from ..summary import summary_lines
from .flags import setting_options
from .settings_help import SettingsCommand, WorkloadChoice

__all__ = ["estimate_command", "run_command"]


def _workload_option(func):
    default = registry.default_workload()
    return click.option(
        "--workload",
        type=WorkloadChoice(registry.names()),
        metavar="NAME",
        default=None,
        help="Workload of a job given by flags alone (as PIPELINE_WORKLOAD, also of job "
        f"files naming none). [default: {default}]",
    )(func)


@click.command("run", cls=SettingsCommand, context_settings={"show_default": False})
@click.argument("job_files", nargs=-1, type=click.Path(dir_okay=False))
@_workload_option
@setting_options
def run_command(job_files, workload, **values) -> None:
    """Run JOB_FILES (TOML) in sequence on one cluster connection.

    Each --a-flag is also a job-file key a_flag and a variable PIPELINE_A_FLAG (a flag
    wins over a key, a key over a variable). A job resumes: only the tasks missing
    from its output run (--overwrite starts over).
    """
    from ..dispatch.session import INTERRUPTED

    INTERRUPTED.clear()
    signal.signal(signal.SIGINT, _interrupt)
    verbose = click.get_current_context().find_root().params.get("verbose", 0) > 0
    failed = False

    def told(job, summary) -> None:
        # As each job ends: a later job's error must not hide what an earlier one did.
        nonlocal failed
        for line, err in summary_lines(summary, verbose):
            click.echo(line, err=err)
        failed |= summary.units_failed > job.options.max_failures or (
            not summary.complete and summary.units_failed == 0
        )

    try:
        jobs = load_jobs(job_files, values, workload=workload)
        run_jobs(jobs, echo=lambda m: click.echo(m, err=True), on_summary=told,
                 started=_process_start())  # fmt: skip
    except KeyboardInterrupt as exc:
        _exit_interrupted(exc)
    if failed:
        sys.exit(1)


#: Settings of a run that an estimate, which writes none of the job's output, refuses
#: (a job file's keys serve both)
ESTIMATE_REFUSES = ("report", "profile", "profile_tasks", "overwrite", "max_failures", "progress")


@click.command(
    "estimate",
    cls=SettingsCommand,
    refused=ESTIMATE_REFUSES,
    context_settings={"show_default": False},
)
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@_workload_option
@click.option(
    "--fleet",
    "fleets",
    multiple=True,
    help="A fleet to project on, INSTANCE_TYPE:COUNT (repeatable), priced with the Terraform "
    "module's scheduler and load balancer. [default: c5.24xlarge:5, the module's]",
)
@setting_options
def estimate_command(job_file, workload, fleets, **values) -> None:
    """Project JOB_FILE's (or the flags' job) wall time, cost and runs per day on a fleet.

    Runs the job's probe tasks (a sample of its units) on this cluster into a scratch
    output, deleted afterwards, and names the limit that binds: CPU, the network, S3
    request rates or the scheduler. Each --a-flag is also a job-file key a_flag and a
    variable PIPELINE_A_FLAG (a flag wins over a key, a key over a variable).
    """
    from ..cluster.connect import connect
    from ..costs.estimate import estimate, estimate_lines, scratch_output
    from ..costs.prices import DEFAULT_WORKER_INSTANCE, DEFAULT_WORKER_INSTANCES, load_prices
    from ..costs.run_cost import parse_fleet

    ignored = [n for n in ESTIMATE_REFUSES if values.get(n) is not None]
    if ignored:
        flag = "--" + ignored[0].replace("_", "-")
        raise click.UsageError(
            f"{flag} does not apply to `pipeline estimate`, which writes none of the job's "
            "output; give it to `pipeline run`"
        )
    from ..dispatch.session import INTERRUPTED

    INTERRUPTED.clear()
    signal.signal(signal.SIGINT, _interrupt)
    try:
        (job,) = load_jobs([job_file] if job_file else [], values, workload=workload)
        table = load_prices(job.options.price_file)
        default = f"{DEFAULT_WORKER_INSTANCE}:{DEFAULT_WORKER_INSTANCES}"
        fleet_list = [parse_fleet(f, table) for f in fleets or (default,)]
        # the cluster closed (its tasks stopped) before the scratch output is deleted
        with scratch_output(job.options.output) as scratch, connect(job.options) as client:
            result = estimate(
                lambda opts: dataclasses.replace(job, options=opts).build(),
                job.options,
                client,
                fleet_list,
                scratch,
            )
    except KeyboardInterrupt:
        click.echo("interrupted: no estimate; its scratch output is deleted", err=True)
        sys.exit(130)
    for line in estimate_lines(result):
        click.echo(line)


def _exit_interrupted(exc: KeyboardInterrupt) -> None:
    """Say what is complete, stop any worker process still running, and exit 130
    without the interpreter's teardown, where half-closed Dask clients print
    tracebacks of their own (the cluster itself is already shut down)."""
    import multiprocessing

    if isinstance(exc, (Interrupted, InterruptedBeforeTasks)):
        click.echo(exc.recounted(), err=True)
    else:
        # Reading the job files, or a second Ctrl-C while the first one's count was
        # made: no count to give, and nothing said about how far the job got.
        click.echo("interrupted: run the same command again; it resumes where this run "
                   "stopped", err=True)  # fmt: skip
    for child in multiprocessing.active_children():
        child.terminate()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def _process_start() -> float | None:
    """When this process started, on :func:`time.perf_counter`'s clock: the command's
    wall time counts the interpreter's start and imports too (None: not known)."""
    import time

    try:
        import psutil

        ago = time.time() - psutil.Process().create_time()
    except Exception:  # (no psutil, or no process table: counted from the run's start)
        return None
    return time.perf_counter() - ago if 0 <= ago < 3600 else None


def _interrupt(signum, frame) -> None:
    """Ctrl-C: one line, not the tracebacks that the cluster's threads and callbacks
    report when a shutdown interrupts them (closed connection pools, half-started
    workers): those are silenced from the moment of the signal."""
    from ..dispatch.session import INTERRUPTED

    INTERRUPTED.set()  # (raised again by the run's wait if a callback swallows this one)
    logging.disable(logging.CRITICAL)
    sys.unraisablehook = lambda unraisable: None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise KeyboardInterrupt
