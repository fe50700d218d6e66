"""The ``pipeline`` command line."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys

import click

from . import __version__, registry
from .config import RunOptions, env_name, flag_name, settings_of
from .errors import Interrupted, PipelineError
from .jobs import load_jobs, run_jobs
from .summary import summary_lines

_ALL_SETTINGS = {
    f.name: f
    for cls in (RunOptions, *(registry.load(n).settings_class for n in registry.names()))
    for f in settings_of(cls)
}


def _setting_options(func):
    """One ``--flag`` per setting, its help naming the job-file key and env var."""
    for f in reversed(list(_ALL_SETTINGS.values())):
        kind = f.metadata["kind"]
        help_text = (
            f"{f.metadata['help']} [key: {f.name}; env: {env_name(f)}"
            + (f"; default: {f.default}" if f.default is not None else "")
            + "]"
        )
        name = flag_name(f)
        if kind is bool:
            option = click.option(f"--{name}/--no-{name}", f.name, default=None, help=help_text)
        else:
            choices = f.metadata["choices"]
            ptype = click.Choice(choices) if choices else (str if kind is dict else kind)
            option = click.option(f"--{name}", f.name, type=ptype, default=None, help=help_text)
        func = option(func)
    return func


def _process_settings_help() -> str:
    from .config import ProcessSettings

    lines = ["\b", "Set in the environment of every process (driver and workers):"]
    for f in settings_of(ProcessSettings):
        lines.append(f"  {env_name(f)}: {f.metadata['help']}")
    return "\n".join(lines)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=_process_settings_help(),
)
@click.version_option(__version__, prog_name="pipeline")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """Run machine-learning data jobs on a Dask cluster.

    With no scheduler configured, jobs run on an embedded local cluster of
    single-threaded worker processes. Settings resolve in the order: flag, job
    file key, PIPELINE_* environment variable, default.
    """
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # Dask logs every connection at INFO; a user asking for -v wants ours. Importing
    # distributed applies its logging config, so set the level after that.
    import distributed  # noqa: F401

    logging.getLogger("distributed").setLevel(logging.DEBUG if verbose > 1 else logging.ERROR)


@main.command("run", context_settings={"show_default": False})
@click.argument("job_files", nargs=-1, type=click.Path(dir_okay=False))
@click.option(
    "--workload",
    type=click.Choice(registry.names()),
    default=None,
    help="Workload of a job given by flags alone (no job file). [default: cubes]",
)
@_setting_options
def run_command(job_files, workload, **values) -> None:
    """Run JOB_FILES (TOML) in sequence on one cluster connection.

    Flags override every job file's keys. A job whose output already holds
    complete tasks resumes: only missing tasks run (--overwrite starts over).
    """
    signal.signal(signal.SIGINT, _interrupt)
    try:
        jobs = load_jobs(job_files, values, workload=workload)
        summaries = run_jobs(jobs, echo=lambda m: click.echo(m, err=True))
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt as exc:
        _exit_interrupted(exc)
    verbose = click.get_current_context().find_root().params.get("verbose", 0) > 0
    failed = False
    for job, summary in zip(jobs, summaries, strict=True):
        for line, err in summary_lines(summary, verbose):
            click.echo(line, err=err)
        failed |= summary.units_failed > job.options.max_failures or (
            not summary.complete and summary.units_failed == 0
        )
    if failed:
        sys.exit(1)


@main.command("estimate", context_settings={"show_default": False})
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option(
    "--fleet",
    "fleets",
    multiple=True,
    help="A fleet to project on, INSTANCE_TYPE:COUNT (repeatable), priced with the Terraform "
    "module's scheduler and load balancer. [default: c5.24xlarge:5, the module's]",
)
@_setting_options
def estimate_command(job_file, fleets, **values) -> None:
    """Project JOB_FILE's wall time, cost and runs per day on a fleet.

    Runs the job's probe tasks (a small sample of its units) on the embedded or
    the connected cluster into a scratch output, deleted afterwards (none of the
    job's output is written), and names the limit that binds: CPU, the network,
    S3 request rates, or the scheduler's task rate.
    """
    from .cluster import connect
    from .cost import parse_fleet
    from .estimate import estimate, estimate_lines
    from .prices import DEFAULT_WORKER_INSTANCE, DEFAULT_WORKER_INSTANCES, load_prices

    try:
        (job,) = load_jobs([job_file], values)
        table = load_prices(job.options.price_file)
        default = f"{DEFAULT_WORKER_INSTANCE}:{DEFAULT_WORKER_INSTANCES}"
        fleet_list = [parse_fleet(f, table) for f in fleets or (default,)]
        with connect(job.options) as client:
            result = estimate(
                lambda opts: dataclasses.replace(job, options=opts).build(),
                job.options,
                client,
                fleet_list,
            )
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from exc
    for line in estimate_lines(result):
        click.echo(line)


def _exit_interrupted(exc: KeyboardInterrupt) -> None:
    """Say what is complete, stop any worker process still running, and exit 130
    without the interpreter's teardown, where half-closed Dask clients print
    tracebacks of their own (the cluster itself is already shut down)."""
    import multiprocessing

    if isinstance(exc, Interrupted):
        click.echo(str(exc), err=True)
    else:
        click.echo(
            "interrupted before any task of this run ran; run the same command again to resume",
            err=True,
        )
    for child in multiprocessing.active_children():
        child.terminate()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def _interrupt(signum, frame) -> None:
    """Ctrl-C: one line, not the tracebacks that the cluster's threads and callbacks
    report when a shutdown interrupts them (closed connection pools, half-started
    workers): those are silenced from the moment of the signal."""
    logging.disable(logging.CRITICAL)
    sys.unraisablehook = lambda unraisable: None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise KeyboardInterrupt


@main.command("workloads")
def workloads_command() -> None:
    """List the registered workloads: each one's package and settings."""
    for name in registry.names():
        e = registry.entry(name)
        click.echo(f"{name}  ({e.target}, from package {e.package})")
        try:
            cls = registry.load(name)
        except PipelineError as exc:
            click.echo(f"  cannot be loaded: {exc}")
            continue
        for f in settings_of(cls.settings_class):
            click.echo(f"  --{flag_name(f):<22} {env_name(f):<28} {f.metadata['help']}")


@main.group("data")
def data_group() -> None:
    """Make input data for demos, tests and benchmarks."""


@data_group.command("frames")
@click.option("--count", type=int, default=100, show_default=True, help="Number of frames.")
@click.option("--rows", type=int, default=1000, show_default=True, help="Rows per frame.")
@click.option("--cols", type=int, default=1000, show_default=True, help="Columns per frame.")
@click.option("--out", required=True, help="Folder or s3:// prefix to write into.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
def frames_command(count, rows, cols, out, seed) -> None:
    """Write parquet frames of random floats rounded to 10 decimals."""
    from .frames import write_frames
    from .storage import open_store

    try:
        store = open_store(out)
        keys = write_frames(store, "", count=count, rows=rows, cols=cols, seed=seed)
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {len(keys)} frames of {rows}x{cols} to {store.url}")


@data_group.command("regressions")
@click.option("--chunks", type=int, default=1000, show_default=True, help="Number of chunks.")
@click.option("--rows", type=int, default=250, show_default=True, help="Rows per chunk.")
@click.option("--features", type=int, default=5, show_default=True, help="Features x1..xK.")
@click.option("--out", required=True, help="Folder or s3:// prefix to write into.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
def regressions_data_command(chunks, rows, features, out, seed) -> None:
    """Write a panel for per-chunk regressions: a `chunk` column, a response `y`,
    features x1..xK and a categorical `sector`, with known coefficients per chunk."""
    from .regress import write_regression_data
    from .storage import open_store

    try:
        facts = write_regression_data(
            open_store(out), "", chunks=chunks, rows=rows, features=features, seed=seed
        )
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {chunks} chunks of {rows} rows to {out}; model: {facts['formula']}")


@main.command("results")
@click.argument("output")
@click.option("--job", help="The job's id, when OUTPUT holds several.")
@click.option(
    "--table",
    help="Which table (a regression job: models or coefficients; a map job: results, "
    "failures). Default: the workload's main table.",
)
@click.option("--out", help="Write the whole table here (.parquet, local or s3://).")
def results_command(output, job, table, out) -> None:
    """Concatenate a job's per-task tables into one, in unit order (or summarize it)."""
    from .results import summarize, write_results

    try:
        if out:
            rows = write_results(output, table, out, job)
            click.echo(f"wrote {rows} rows to {out}")
        else:
            click.echo(summarize(output, table, job))
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from exc


@main.command("certs")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for ca.pem, <role>.pem and <role>-key.pem.",
)
@click.option("--days", type=int, default=365, show_default=True, help="Validity in days.")
@click.option(
    "--host",
    "hosts",
    multiple=True,
    default=("localhost", "127.0.0.1"),
    show_default=True,
    help="Host name or IP for the certificates' SAN (repeatable, or comma-separated).",
)
@click.option("--overwrite", is_flag=True, help="Replace existing files.")
def certs_command(out, days, hosts, overwrite) -> None:
    """Create a CA and TLS certificates for the scheduler, worker and client roles.

    Keys are written with mode 0600. Give the scheduler, workers and driver the
    CA and their own role's pair; keep ca-key.pem offline.
    """
    from .tls import make_certificates

    try:
        files = make_certificates(out, days=days, hosts=hosts, overwrite=overwrite)
    except (ValueError, FileExistsError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {len(files)} files to {out} (valid {days} days for {', '.join(hosts)})")


@main.command("verify")
@click.argument("output")
@click.option("--job", "jobs", multiple=True, help="Only this job id (repeatable).")
def verify_command(output, jobs) -> None:
    """Check OUTPUT (a folder or s3:// prefix) against its manifests.

    Reports objects that are missing, extra (not in any manifest), corrupt
    (checksum differs), and units listed more or fewer than once. Exits
    non-zero when anything is wrong.
    """
    from .verify import verify_output

    try:
        checks = verify_output(output, list(jobs) or None)
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from exc
    bad = False
    for c in checks:
        status = "OK" if c.ok else "FAILED"
        click.echo(
            f"{c.job_id} ({c.workload}): {status}: {c.units_ok} of {c.units_expected} "
            f"units verified in {c.objects_checked} objects; {len(c.missing)} missing, "
            f"{len(c.extra)} extra, {len(c.corrupt)} corrupt, "
            f"{len(c.duplicated)} duplicated"
        )
        for label, items in (
            ("missing", c.missing),
            ("extra", c.extra),
            ("corrupt", c.corrupt),
            ("duplicated", c.duplicated),
        ):
            for item in items[:10]:
                click.echo(f"  {label}: {item}")
            if len(items) > 10:
                click.echo(f"  ... {len(items) - 10} more {label}")
        if c.incomplete:
            click.echo(f"  incomplete: {c.incomplete}")
        bad |= not c.ok
    if bad:
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
