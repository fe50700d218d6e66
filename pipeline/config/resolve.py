"""The one resolution order: CLI flag > job-file key > ``PIPELINE_*`` variable > default."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .settings import coerce, env_name, flag_name, settings_of

if TYPE_CHECKING:
    from .jobfile import JobFile

__all__ = ["check_flags_apply", "check_unknown_keys", "resolve"]


def resolve(
    cls, job: JobFile | None, cli: Mapping[str, Any], environ: Mapping[str, str] | None = None
):
    """Build ``cls`` from CLI values > job-file values > ``PIPELINE_*`` env vars > defaults.

    ``cli`` maps field names to values, ``None`` meaning "not given".
    """
    environ = os.environ if environ is None else environ
    values = {}
    from_env = set()
    for f in settings_of(cls):
        given = None
        try:
            if cli.get(f.name) is not None:
                # A flag that workloads of different types share comes as text: each
                # workload's job parses it by its own type
                given = cli[f.name]
                text = isinstance(given, str)
                values[f.name] = coerce(f, given, f"--{flag_name(f)}", from_text=text)
            elif job is not None and f.name in job.values:
                given = job.values[f.name]
                values[f.name] = coerce(f, given, f"job file {job.path}: key {f.name!r}")
            elif environ.get(env_name(f), "") != "":
                given = environ[env_name(f)]
                values[f.name] = coerce(f, given, f"environment {env_name(f)}", from_text=True)
                from_env.add(f.name)
        except ConfigError as exc:
            raise ConfigError(f"{exc}{_choice_of_another(cls, f, given)}") from None
    _drop_outranked(cls, values, from_env)
    return cls(**values)


def _drop_outranked(cls, values: dict, from_env: set[str]) -> None:
    """Leave out the environment's values that a flag or the job file outranks though
    they name another setting: one of a group of which a job gives one (a map job's
    input: a job file's grid, not an exported PIPELINE_FILES), and a setting that
    applies only with another one the job does not have (chunk_rows, with a grid)."""
    for group in getattr(cls, "ONE_OF", ()):
        if any(name in values and name not in from_env for name in group):
            for name in group:
                if name in from_env:
                    del values[name]
    for name, needed in getattr(cls, "APPLIES_WITH", {}).items():
        if name in from_env and needed not in values:
            del values[name]
    for name, other in getattr(cls, "APPLIES_WITHOUT", {}).items():
        if name in from_env and other in values:
            del values[name]


def _choice_of_another(cls, f: dataclasses.Field, value: Any) -> str:
    """A hint when a value refused is a choice of another setting: family = "logit"
    (a model, or a link)."""
    if f.metadata["choices"] is None or not isinstance(value, str):
        return ""
    others = [g.name for g in settings_of(cls) if g is not f and g.metadata["choices"]
              and value.lower() in (str(c).lower() for c in g.metadata["choices"])]  # fmt: skip
    if not others:
        return ""
    return f" ({value!r} is a value of {' or '.join(others)}: {others[0]} = {value.lower()!r})"


def _is_list_of_tables(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def check_unknown_keys(job: JobFile, *classes, owners=None) -> None:
    """Refuse keys no class of ``classes`` has, with hints; ``owners(keys)``: the other
    workloads that have every one of ``keys``."""
    known = {f.name for cls in classes for f in settings_of(cls)}
    unknown = sorted(set(job.values) - known)
    if unknown:
        import difflib

        close = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
        hints = [f"{c[0]!r}" + (f" for {k!r}" if len(unknown) > 1 else "")
                 for k, c in close.items() if c]  # fmt: skip
        tables = [k for k in unknown if isinstance(job.values[k], dict)]
        # [[job]] tables of job keys (not a grid's [[grid]] points under another workload)
        listed = [k for k in unknown if _is_list_of_tables(job.values[k])
                  and any(set(t) & (known | {"workload"}) for t in job.values[k])]  # fmt: skip
        elsewhere = owners(set(unknown)) if owners is not None and not hints else []
        if elsewhere:  # its keys, tables or not: nothing else to say of them
            table = f' (settings of workload {elsewhere[0]!r}: set workload = "{elsewhere[0]}")'
        elif listed:
            table = (
                f" ([[{listed[0]}]] is a list of TOML tables: a job file holds one job, its "
                "keys at the top level; for several jobs give several files, "
                "pipeline run a.toml b.toml)"
            )
        elif tables:
            table = f" ([{tables[0]}] is a TOML table: a job's keys go at the top level)"
        else:
            table = ""

        raise ConfigError(
            f"job file {job.path}: unknown key(s) {', '.join(map(repr, unknown))} "
            f"for workload {job.workload!r}"
            + (f" (did you mean {', '.join(hints)}?)" if hints else "")
            + table
            + f"; known keys: {', '.join(sorted(known))}"
        )


def check_flags_apply(cli: Mapping[str, Any], workload: str, *classes) -> None:
    known = {f.name for cls in classes for f in settings_of(cls)}
    extra = sorted(k for k, v in cli.items() if v is not None and k not in known)
    if extra:
        flags = ", ".join("--" + k.replace("_", "-") for k in extra)
        raise ConfigError(f"{flags} do(es) not apply to a {workload!r} job")
