"""Every setting as a ``--flag`` of ``pipeline run`` and ``pipeline estimate``: the run's
and each registered workload's (this module imports the workloads, so the commands
that need it load it when they run or show their help). What their help shows of
them is :mod:`.settings_help`'s."""

from __future__ import annotations

import dataclasses

import click

from .. import registry
from ..config import RunOptions, flag_name, settings_of
from ..errors import PipelineError

__all__ = ["ALL_SETTINGS", "flag_for", "setting_options"]


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


ALL_SETTINGS = _all_settings()


def _form(f: dataclasses.Field) -> tuple:
    return f.metadata["kind"], f.metadata["choices"]


def flag_for(owned: list[tuple[str | None, dataclasses.Field]]) -> tuple[list[str], dict]:
    """The flag (declarations, attributes) of a setting the ``owned`` workloads have.
    Workloads that agree on its type share a typed flag; where they differ (a plug-in's
    ``dim`` of text beside the cubes' number), the flag takes text and each job's
    workload parses it by its own type (:func:`pipeline.config.resolve`): the last
    registered workload's type made the flag refuse the others' values."""
    f = owned[0][1]
    kind, choices = _form(f)
    shared = len({_form(g) for _, g in owned}) > 1
    flag = flag_name(f)
    if kind is bool and not shared:
        return [f"--{flag}/--no-{flag}", f.name], {"default": None}
    attrs: dict = {"default": None}
    if shared:
        attrs |= {"type": click.STRING, "metavar": "VALUE"}
    elif choices:
        attrs["type"] = click.Choice(choices, case_sensitive=False)
    else:
        attrs["type"] = str if kind is dict else kind
    return [f"--{flag}", f.name], attrs


def setting_options(func):
    """One ``--flag`` per setting (their help: :mod:`.settings_help`)."""
    for owned in reversed(list(ALL_SETTINGS.values())):
        decls, attrs = flag_for(owned)
        func = click.option(*decls, **attrs)(func)
    return func
