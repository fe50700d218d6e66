"""Jobs: from job files, flags and env vars to workloads, and running a batch of them."""

from __future__ import annotations

import contextlib
import logging
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import registry
from .cluster.shipped_code import add_import_paths
from .config import (
    ENV_PREFIX,
    ProcessSettings,
    RunOptions,
    check_flags_apply,
    check_unknown_keys,
    resolve,
    settings_of,
)
from .config.jobfile import JobFile
from .config.settings import read_text
from .errors import ConfigError, PipelineError
from .layout import check_job_id, inside_job_folder, reads_below
from .storage.globs import has_magic
from .workload import Workload

log = logging.getLogger(__name__)

__all__ = [
    "Job",
    "check_driver_paths",
    "check_inputs_outside",
    "load_job_file",
    "load_jobs",
    "naming_file",
]


@dataclass(frozen=True)
class Job:
    """One resolved job: how to run it, its workload settings, and its id."""

    workload: str
    options: RunOptions
    settings: Any
    job_id: str
    source: Path | None

    def __post_init__(self) -> None:
        # Checked where a job is made, from files or in Python: the driver runs it
        # without checking its name again.
        check_job_id(self.job_id)

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
        with naming_file(jf.path, len(files) > 1):
            kind = jf.workload
            settings_cls = registry.load(kind).settings_class
            if jf.path is not None:
                check_unknown_keys(jf, RunOptions, settings_cls, owners=_workloads_with)
            check_flags_apply(cli, kind, RunOptions, settings_cls)
            options = resolve(RunOptions, jf, cli, environ)
            settings = resolve(settings_cls, jf, cli, environ)
            jobs.append(Job(kind, options, settings, settings.name or jf.stem or kind, jf.path))
    _check_distinct(jobs)
    _warn_misspelled_variables(environ, [type(job.settings) for job in jobs])
    return jobs


#: The variable naming the workload of a job that does not name one.
WORKLOAD_VARIABLE = f"{ENV_PREFIX}WORKLOAD"


def _workload_from(environ: Mapping[str, str]) -> str:
    name = environ.get(WORKLOAD_VARIABLE, "").strip()
    if not name:
        default = registry.default_workload()
        if default is None:
            raise ConfigError(
                f"no workload named: give workload = NAME in the job file, --workload or "
                f"{WORKLOAD_VARIABLE} (one of {', '.join(registry.names())})"
            )
        return default
    if name not in registry.names():
        raise ConfigError(
            f"environment {WORKLOAD_VARIABLE}: {name!r} is not a workload"
            f"{registry.did_you_mean(name)}, expected one of {', '.join(registry.names())}"
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


@contextlib.contextmanager
def naming_file(source: Path | None, several: bool):
    """An error about one of several jobs names its job file (``badb.toml: function
    fits:fit_one(alpha, n, seed) does not accept the grid key(s) 'm'``): the message
    alone did not say which file to fix."""
    try:
        yield
    except PipelineError as exc:
        if several and source is not None and str(source) not in str(exc):
            exc.args = (f"{source}: {exc}",)
        raise


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


def load_job_file(path: str | os.PathLike, default_workload: str) -> JobFile:
    """A job file's keys; its ``workload`` (or ``default_workload``) is checked when the
    workload is loaded from the registry."""
    p = Path(path)
    try:
        data = tomllib.loads(read_text(p))
    except FileNotFoundError:
        hint = ""
        named = registry.closest(str(path)) if not p.suffix and len(p.parts) == 1 else None
        if named:  # `pipeline run map` (or `mapp`): a workload's name, not a file
            hint = f" (to run the {named} workload from flags alone: --workload {named})"
        elif str(path).lower() in ("true", "false", "yes", "no", "on", "off"):
            # `--progress false`: an on/off flag takes no value, so the word became a file
            hint = " (an on/off flag such as --overwrite takes no value; --no-overwrite is off)"
        raise ConfigError(f"job file {p}: no such file{hint}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"job file {p}: not valid TOML: {exc}") from None
    if not data:  # an empty file would run the default job: 1,000 cubes, 8 GB written
        raise ConfigError(
            f"job file {p}: no settings in it; a job file says which workload it runs "
            f"(workload = {' | '.join(map(repr, registry.names()))}) and its settings"
        )
    nested = [k for k, v in data.items() if isinstance(v, dict) and "workload" in v]
    if "workload" not in data and nested:
        raise ConfigError(
            f"job file {p}: a job's keys go at the top level of the file, not under "
            f"[{nested[0]}] (one job per file; drop the [{nested[0]}] line)"
        )
    workload = data.pop("workload", default_workload)
    if not isinstance(workload, str):
        raise ConfigError(f"job file {p}: workload = {workload!r} is not a workload name")
    if workload not in registry.names():
        raise ConfigError(
            f"job file {p}: workload = {workload!r} is not known"
            f"{registry.did_you_mean(workload)}, expected one of {', '.join(registry.names())}"
        )
    return JobFile(p, workload, data)
