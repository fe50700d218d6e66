"""The ``pipeline`` command line."""

from __future__ import annotations

import collections
import logging
import sys

import click

from . import __version__
from .config import RunOptions, env_name, flag_name, settings_of
from .errors import PipelineError
from .jobs import WORKLOADS, load_jobs, run_jobs
from .runner import RunSummary

_ALL_SETTINGS = {f.name: f for cls in (RunOptions, *(w.settings for w in WORKLOADS.values()))
                 for f in settings_of(cls)}


def _setting_options(func):
    """One ``--flag`` per setting, its help naming the job-file key and env var."""
    for f in reversed(list(_ALL_SETTINGS.values())):
        kind = f.metadata["kind"]
        help_text = (f"{f.metadata['help']} [key: {f.name}; env: {env_name(f)}"
                     + (f"; default: {f.default}" if f.default is not None else "") + "]")
        name = flag_name(f)
        if kind is bool:
            option = click.option(f"--{name}/--no-{name}", f.name, default=None, help=help_text)
        else:
            choices = f.metadata["choices"]
            ptype = click.Choice(choices) if choices else kind
            option = click.option(f"--{name}", f.name, type=ptype, default=None,
                                  help=help_text)
        func = option(func)
    return func


@click.group(context_settings={"help_option_names": ["-h", "--help"],
                               "max_content_width": 100})
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
@click.option("--workload", type=click.Choice(list(WORKLOADS)), default=None,
              help="Workload of a job given by flags alone (no job file). [default: cubes]")
@_setting_options
def run_command(job_files, workload, **values) -> None:
    """Run JOB_FILES (TOML) in sequence on one cluster connection.

    Flags override every job file's keys. A job whose output already holds
    complete tasks resumes: only missing tasks run (--overwrite starts over).
    """
    try:
        jobs = load_jobs(job_files, values, workload=workload)
        summaries = run_jobs(jobs, echo=lambda m: click.echo(m, err=True))
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from exc
    failed = False
    for job, summary in zip(jobs, summaries, strict=True):
        _print_summary(summary)
        failed |= (summary.units_failed > job.options.max_failures
                   or (not summary.complete and summary.units_failed == 0))
    if failed:
        sys.exit(1)


def _print_summary(s: RunSummary) -> None:
    click.echo(f"{s.workload} job {s.job_id!r}: {s.units_run - s.units_failed} of {s.units_run} "
               f"{'units' if s.workload != 'cubes' else 'cubes'} in {s.wall_seconds:.2f} s = "
               f"{s.units_per_second:,.0f}/s on {s.workers} workers "
               f"({s.tasks} tasks of {s.units_per_task}, {s.tasks_skipped} skipped as complete)")
    if s.bytes_written:
        click.echo(f"  wrote {s.bytes_written / 1e9:.2f} GB "
                   f"({s.bytes_written / 1e9 / max(s.wall_seconds, 1e-9):.2f} GB/s)")
    if s.output:
        click.echo(f"  results: {s.output}")
    for key, value in s.details.items():
        click.echo(f"  {key}: {value}")
    if s.units_failed:
        by_type = collections.Counter(f["error_type"] for f in s.failures)
        click.echo(f"  FAILED: {s.units_failed} units "
                   f"({', '.join(f'{n} {t}' for t, n in by_type.most_common())}); "
                   "run the same command again to retry them", err=True)
        for f in s.failures[:5]:
            click.echo(f"    unit {f['unit']}: {f['error_type']}: {f['message']}", err=True)
        if len(s.failures) > 5:
            click.echo(f"    ... and {len(s.failures) - 5} more", err=True)


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


if __name__ == "__main__":  # pragma: no cover
    main()


