"""The ``pipeline`` command line: the group, its settings as flags, and ``run``; the
commands about data and outputs are in :mod:`.outputs`."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys

import click

from .. import __version__, registry
from ..config import RunOptions, env_name, flag_name, settings_of
from ..errors import Interrupted, PipelineError
from ..jobs import load_jobs, run_jobs
from ..summary import summary_lines
from .outputs import (
    certs_command,
    data_group,
    results_command,
    verify_command,
    workloads_command,
)


def _all_settings() -> dict[str, list[tuple[str | None, dataclasses.Field]]]:
    """Every setting by name, for the flags: the run's (workload None) and each
    workload's that imports, as (workload, field). A plug-in that does not import is
    named when a job uses it (and by `pipeline workloads`): it made every command,
    --help too, a traceback."""
    out: dict[str, list] = {f.name: [(None, f)] for f in settings_of(RunOptions)}
    for name in registry.names():
        try:
            cls = registry.load(name).settings_class
        except PipelineError:
            continue
        for f in settings_of(cls):
            out.setdefault(f.name, []).append((name, f))
    return out


_ALL_SETTINGS = _all_settings()


def _form(f: dataclasses.Field) -> tuple:
    return f.metadata["kind"], f.metadata["choices"]


def _option(owned: list[tuple[str | None, dataclasses.Field]]) -> tuple[list[str], dict]:
    """The flag (declarations, attributes) of a setting the ``owned`` workloads have.
    Workloads that agree on its type share a typed flag; where they differ (a plug-in's
    ``dim`` of text beside the cubes' number), the flag takes text and each job's
    workload parses it by its own type (:func:`pipeline.config.resolve`): the last
    registered workload's type made the flag refuse the others' values."""
    f = owned[0][1]
    kind, choices = _form(f)
    shared = len({_form(g) for _, g in owned}) > 1
    if not shared:
        same = all(g.default == f.default for _, g in owned)
        default = f"; default: {f.default}" if same and f.default is not None else ""
        text = f"{f.metadata['help']} [key: {f.name}; env: {env_name(f)}{default}]"
    else:

        def own(g: dataclasses.Field) -> str:
            what = ", ".join(map(str, g.metadata["choices"] or ())) or g.metadata["kind"].__name__
            default = f", default: {g.default}" if g.default is not None else ""
            return f"{g.metadata['help']} ({what}{default})"

        text = "; ".join(f"{w}: {own(g)}" for w, g in owned)
        text += f" [key: {f.name}; env: {env_name(f)}]"
    flag = flag_name(f)
    if kind is bool and not shared:
        return [f"--{flag}/--no-{flag}", f.name], {"default": None, "help": text}
    attrs = {"default": None, "help": text}
    if shared:
        attrs |= {"type": click.STRING, "metavar": "VALUE"}
    elif choices:
        attrs["type"] = click.Choice(choices, case_sensitive=False)
    else:
        attrs["type"] = str if kind is dict else kind
    return [f"--{flag}", f.name], attrs


def _setting_options(func):
    """One ``--flag`` per setting, its help naming the job-file key and env var."""
    for owned in reversed(list(_ALL_SETTINGS.values())):
        decls, attrs = _option(owned)
        func = click.option(*decls, **attrs)(func)
    return func


class _RunCommand(click.Command):
    """``pipeline run --workload NAME --help`` lists the run's settings and that
    workload's, not every registered workload's."""

    def parse_args(self, ctx, args):
        ctx.meta["help_workload"] = _named_workload(args)
        return super().parse_args(ctx, args)

    def format_options(self, ctx, formatter) -> None:
        name = ctx.meta.get("help_workload")
        if name not in registry.names():
            return super().format_options(ctx, formatter)
        own = {f.name: f for f in settings_of(RunOptions)}
        own |= {f.name: f for f in settings_of(registry.load(name).settings_class)}
        rows = []
        for p in self.get_params(ctx):
            if isinstance(p, click.Option) and p.name in _ALL_SETTINGS:
                if p.name not in own:
                    continue
                decls, attrs = _option([(name, own[p.name])])  # its own type and help
                p = click.Option(decls, **attrs)
            if isinstance(p, click.Option):
                rows.append(p.get_help_record(ctx))
        with formatter.section(f"Options (the run's and the {name!r} workload's)"):
            formatter.write_dl([r for r in rows if r])


def _named_workload(args: list[str]) -> str | None:
    for i, arg in enumerate(args):
        if arg == "--workload" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--workload="):
            return arg.split("=", 1)[1]
    return None


def _process_settings_help() -> str:
    from ..config import ProcessSettings

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
    _set_verbosity(verbose)


def _set_verbosity(verbose: int) -> None:
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", force=True)
    # Dask logs every connection at INFO; a user asking for -v wants ours. Importing
    # distributed applies its logging config, so set the level after that.
    import distributed  # noqa: F401

    logging.getLogger("distributed").setLevel(logging.DEBUG if verbose > 1 else logging.ERROR)


def _command_verbosity(ctx: click.Context, param, count: int) -> None:
    """`pipeline run job.toml -v` as `pipeline -v run job.toml`: the counts add up."""
    if count:
        root = ctx.find_root()
        root.params["verbose"] = root.params.get("verbose", 0) + count
        _set_verbosity(root.params["verbose"])


def _add_verbose_option(command: click.Command) -> None:
    command.params.append(
        click.Option(
            ["-v", "--verbose", "command_verbose"],
            count=True,
            expose_value=False,
            callback=_command_verbosity,
            help="More log output (-vv for debug), as before the command.",
        )
    )
    for sub in getattr(command, "commands", {}).values():
        _add_verbose_option(sub)


@main.command("run", cls=_RunCommand, context_settings={"show_default": False})
@click.argument("job_files", nargs=-1, type=click.Path(dir_okay=False))
@click.option(
    "--workload",
    type=click.Choice(registry.names()),
    default=None,
    help="Workload of a job given by flags alone (no job file). [env: PIPELINE_WORKLOAD, "
    "also for a job file that names none; default: cubes]",
)
@_setting_options
def run_command(job_files, workload, **values) -> None:
    """Run JOB_FILES (TOML) in sequence on one cluster connection.

    Flags override every job file's keys. A job whose output already holds
    complete tasks resumes: only missing tasks run (--overwrite starts over).
    """
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
        run_jobs(jobs, echo=lambda m: click.echo(m, err=True), on_summary=told)
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt as exc:
        _exit_interrupted(exc)
    if failed:
        sys.exit(1)


@main.command("estimate", cls=_RunCommand, context_settings={"show_default": False})
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--workload",
    type=click.Choice(registry.names()),
    default=None,
    help="Workload of a job given by flags alone (no job file). [env: PIPELINE_WORKLOAD, "
    "also for a job file that names none; default: cubes]",
)
@click.option(
    "--fleet",
    "fleets",
    multiple=True,
    help="A fleet to project on, INSTANCE_TYPE:COUNT (repeatable), priced with the Terraform "
    "module's scheduler and load balancer. [default: c5.24xlarge:5, the module's]",
)
@_setting_options
def estimate_command(job_file, workload, fleets, **values) -> None:
    """Project JOB_FILE's (or the job the flags give) wall time, cost and runs per day
    on a fleet.

    Runs the job's probe tasks (a small sample of its units) on the embedded or
    the connected cluster into a scratch output, deleted afterwards (none of the
    job's output is written), and names the limit that binds: CPU, the network,
    S3 request rates, or the scheduler's task rate.
    """
    from ..cluster.connect import connect
    from ..costs.estimate import estimate, estimate_lines, scratch_output
    from ..costs.prices import DEFAULT_WORKER_INSTANCE, DEFAULT_WORKER_INSTANCES, load_prices
    from ..costs.run_cost import parse_fleet

    # Flags of a run that an estimate would ignore (a job file's keys serve both)
    ignored = [n for n in ("report", "profile", "profile_tasks", "overwrite", "max_failures",
                           "progress") if values.get(n) is not None]  # fmt: skip
    if ignored:
        flag = "--" + ignored[0].replace("_", "-")
        raise click.UsageError(
            f"{flag} does not apply to `pipeline estimate`, which writes none of the job's "
            "output; give it to `pipeline run`"
        )
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
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from exc
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

    if isinstance(exc, Interrupted):
        click.echo(exc.recounted(), err=True)
    else:
        # (before the run's tasks, or a second Ctrl-C while the first one's count was
        # made: "before any task ran" was said of a run 548 tasks into its job)
        click.echo(
            "interrupted: the tasks that completed are kept; run the same command again to resume",
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


for _command in (workloads_command, data_group, results_command, certs_command, verify_command):
    main.add_command(_command)
for _command in main.commands.values():
    _add_verbose_option(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
