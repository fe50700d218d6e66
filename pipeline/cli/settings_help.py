"""What ``pipeline run --help`` and ``pipeline estimate --help`` show of the settings.

Every job's options fit one screen, and the help says where each workload's own are:
``--workload NAME --help`` or ``JOB.toml --help`` shows that workload's options in
full (every registered workload's at once made 207 lines). Each row leaves out the
job-file key and variable: they follow from the flag's name by one rule, which the
command's description gives once.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import click

from .. import registry
from ..config import RunOptions, flag_name, settings_of
from ..errors import PipelineError
from ..jobs import WORKLOAD_VARIABLE, load_job_file
from .flags import ALL_SETTINGS, flag_for

__all__ = ["SettingsCommand", "WorkloadChoice"]

#: The widest first column before an option's text goes to the next line.
FLAG_COLUMN = 24


class WorkloadChoice(click.Choice):
    """``--workload``: a registered name; a close miss is named ("did you mean")."""

    def get_invalid_choice_message(self, value, ctx) -> str:
        said = super().get_invalid_choice_message(value, ctx)
        hint = registry.did_you_mean(value)
        return f"{said.rstrip('.')}{hint}." if hint else said


class SettingsCommand(click.Command):
    """A command whose flags are every setting: its help shows the run's settings,
    or those of the workloads that ``--workload NAME`` or the job files name.
    ``refused``: the run's settings the command refuses, left out of its help."""

    def __init__(self, *args, refused: tuple[str, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.refused = refused

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if any(arg in ctx.help_option_names for arg in args):
            ctx.meta["help_workloads"] = _workloads_named(ctx, _job_files(self, args), args)
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        named = ctx.meta.get("help_workloads") or []
        run = {f.name: f for f in settings_of(RunOptions) if f.name not in self.refused}
        # --workload, -v, -h, and a command's own (estimate's --fleet)
        others = [p for p in self.get_params(ctx)
                  if isinstance(p, click.Option) and p.name not in ALL_SETTINGS]  # fmt: skip
        if not named:
            rows = [_row(ctx, f) for f in run.values()]
            rows += [r for p in others if (r := p.get_help_record(ctx))]
            with formatter.section("Options of every job"):
                formatter.write_dl(rows, col_max=FLAG_COLUMN)
            _where_workloads_are(ctx, formatter)
            return
        for name in named:
            own = settings_of(registry.load(name).settings_class)
            with formatter.section(f"Options of the {name!r} workload"):
                formatter.write_dl([_row(ctx, f, name) for f in own], col_max=FLAG_COLUMN)
        with formatter.section("Options"):
            formatter.write_dl([r for p in others if (r := p.get_help_record(ctx))])
        formatter.write_paragraph()
        some = ", ".join("--" + flag_name(f) for f in list(run.values())[:2])
        formatter.write_text(f"Every job's options ({some}, ...): {ctx.command_path} --help")


def _row(ctx: click.Context, f: dataclasses.Field, workload: str | None = None) -> tuple:
    """One setting's help row: its flag in ``workload``'s own type, its help, its default."""
    text = f.metadata["help"]
    if f.metadata["kind"] is bool:
        flag = f"--[no-]{flag_name(f)}"
        text += " [default: on]" if f.default else ""
    else:
        decls, attrs = flag_for([(workload, f)])
        flag = click.Option(decls, **attrs).get_help_record(ctx)[0]
        text += f" [default: {f.default}]" if f.default is not None else ""
    return flag, text


def _where_workloads_are(ctx: click.Context, formatter: click.HelpFormatter) -> None:
    command = ctx.command_path
    with formatter.section(f"Each workload's options ({', '.join(registry.names())})"):
        formatter.write_dl(
            [
                (f"{command} --workload NAME --help", "that workload's options"),
                (f"{command} JOB.toml --help", "the job file's workload's"),
                (f"{ctx.find_root().command_path} workloads", "every workload's settings"),
            ],
            col_max=40,
        )


def _job_files(command: click.Command, args: list[str]) -> list[str]:
    """The job files among a command line's arguments: existing .toml files that are
    not an option's value (``--grid points.toml``)."""
    valued = {name for p in command.params if isinstance(p, click.Option)
              and not p.is_flag and not p.count for name in p.opts}  # fmt: skip
    return [arg for before, arg in zip(["", *args], args, strict=False)
            if before not in valued and arg.lower().endswith(".toml")
            and Path(arg).is_file()]  # fmt: skip


def _workloads_named(ctx: click.Context, job_files: list[str], args: list[str]) -> list[str]:
    """The workloads whose options a ``--help`` shows: the job files' (a file that
    names none runs PIPELINE_WORKLOAD's or the default), else ``--workload``'s; none
    (every job's options) for neither, or a job file that does not read (its run
    says why)."""
    default = os.environ.get(WORKLOAD_VARIABLE, "").strip() or registry.default_workload()
    found: list[str] = []
    for path in job_files:
        try:
            name = load_job_file(path, default).workload
        except PipelineError:
            continue
        found += [name] if name not in found else []
    given = _flag_value(args, "--workload")
    if not found and given is not None:
        if given not in registry.names():
            ctx.fail(
                f"--workload {given!r} is not a workload{registry.did_you_mean(given)}; "
                f"expected one of {', '.join(registry.names())}"
            )
        found = [given]
    for name in found:
        try:
            registry.load(name)
        except PipelineError as exc:
            ctx.fail(str(exc))
    return found


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
