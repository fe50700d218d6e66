"""Every setting as a ``--flag`` of ``pipeline run`` and ``pipeline estimate``: the run's
and each registered workload's (this module imports the workloads, so the commands
that need it load it when they run or show their help)."""

from __future__ import annotations

import dataclasses

import click

from .. import registry
from ..config import RunOptions, env_name, flag_name, settings_of
from ..errors import PipelineError

__all__ = ["SettingsCommand", "setting_options"]


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


def setting_options(func):
    """One ``--flag`` per setting, its help naming the job-file key and env var."""
    for owned in reversed(list(_ALL_SETTINGS.values())):
        decls, attrs = _option(owned)
        func = click.option(*decls, **attrs)(func)
    return func


class SettingsCommand(click.Command):
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
