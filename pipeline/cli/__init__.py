"""The ``pipeline`` command line: the group and its lazily loaded commands.

Each command's module is imported when the command runs or shows its help, so that
``pipeline --help`` and every command that needs none import no workload: ``run``
and ``estimate`` (:mod:`.run`) take every registered workload's settings as flags
(:mod:`.flags`); the outputs' commands are in :mod:`.outputs`; ``pipeline data``
holds the commands the workloads register under the entry-point group
``pipeline.data`` (``pipeline data frames``, ``pipeline data regressions``).
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points

import click

from .. import __version__
from ..config import ProcessSettings, env_name, settings_of
from ..errors import PipelineError

__all__ = ["main"]

#: Entry-point group of the workloads' ``pipeline data NAME`` commands (click commands).
DATA_GROUP = "pipeline.data"


class _LazyGroup(click.Group):
    """A group whose commands are imported when used; ``lazy`` maps each name to
    (``module:attribute``, its one-line help for the group's listing)."""

    def __init__(self, *args, lazy: dict[str, tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def invoke(self, ctx: click.Context):
        # The one place a command's PipelineError becomes click's error line and exit 1.
        try:
            return super().invoke(ctx)
        except PipelineError as exc:
            raise click.ClickException(str(exc)) from exc

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self.lazy, *(n for n in super().list_commands(ctx) if n not in self.lazy)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            module, _, attribute = self.lazy[name][0].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            _add_verbose_option(command)
            self.add_command(command, name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter) -> None:
        rows = [(name, self.lazy[name][1]) for name in self.lazy]
        rows += [
            (name, command.get_short_help_str(formatter.width))
            for name, command in self.commands.items()
            if name not in self.lazy and not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _process_settings_help() -> str:
    lines = ["\b", "Set in the environment of every process (driver and workers):"]
    for f in settings_of(ProcessSettings):
        lines.append(f"  {env_name(f)}: {f.metadata['help']}")
    return "\n".join(lines)


_COMMANDS = {
    "run": ("pipeline.cli.run:run_command", "Run job files (TOML) in sequence on one cluster."),
    "estimate": (
        "pipeline.cli.run:estimate_command",
        "Project a job's wall time, cost and runs per day on a fleet.",
    ),
    "results": (
        "pipeline.cli.outputs:results_command",
        "A job's table, its tasks' parts in unit order (or a summary).",
    ),
    "verify": (
        "pipeline.cli.outputs:verify_command",
        "Check an output against its manifests (--repair: redo damaged tasks).",
    ),
    "data": ("pipeline.cli:data_group", "Make input data for demos, tests and benchmarks."),
    "workloads": (
        "pipeline.cli.outputs:workloads_command",
        "List the registered workloads: each one's package and settings.",
    ),
    "certs": (
        "pipeline.cli.outputs:certs_command",
        "Make a CA and TLS certificates for scheduler, workers and client.",
    ),
}


@click.group(
    cls=_LazyGroup,
    lazy=_COMMANDS,
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


def _data_commands() -> dict[str, tuple[str, str]]:
    """The ``pipeline data`` commands the installed workloads register."""
    found = {}
    for ep in sorted(entry_points(group=DATA_GROUP), key=lambda ep: ep.name):
        found[ep.name] = (ep.value, "")
    return found


class _DataGroup(_LazyGroup):
    """``pipeline data``: its listing loads the (small) command modules for their help."""

    def format_commands(self, ctx: click.Context, formatter) -> None:
        for name in self.lazy:
            self.get_command(ctx, name)
        self.lazy = {
            name: (target, self.commands[name].get_short_help_str(formatter.width))
            for name, (target, _) in self.lazy.items()
        }
        super().format_commands(ctx, formatter)


@click.group("data", cls=_DataGroup, lazy=_data_commands())
def data_group() -> None:
    """Make input data for demos, tests and benchmarks."""


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
    if any(p.name == "command_verbose" for p in command.params):
        return
    command.params.append(
        click.Option(
            ["-v", "--verbose", "command_verbose"],
            count=True,
            expose_value=False,
            callback=_command_verbosity,
            help="More log output (-vv: debug).",
        )
    )
    for sub in getattr(command, "commands", {}).values():
        _add_verbose_option(sub)


if __name__ == "__main__":  # pragma: no cover
    main()
