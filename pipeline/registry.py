"""Workloads by name, from the entry-point group ``pipeline.workloads``.

Built-in workloads are registered there exactly as a third party's are (in this
package's ``pyproject.toml``), and a workload is imported only when a job uses it
or a command lists it. A plug-in package declares, in its own ``pyproject.toml``::

    [project.entry-points."pipeline.workloads"]
    my_workload = "my_package.module:MyWorkload"

The class is a :class:`pipeline.Workload` with a ``settings_class`` (a dataclass of
:func:`pipeline.config.setting` fields) and a ``from_settings`` class method.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from .errors import ConfigError

__all__ = ["GROUP", "WorkloadEntry", "closest", "default_workload", "describe", "did_you_mean",
           "load", "names"]  # fmt: skip

GROUP = "pipeline.workloads"
#: The distribution of the built-in workloads.
BUILT_IN = "pipeline"
#: The entry-point group where this package names the workload of a job that names none
#: (a job file without ``workload``, or flags alone): the entry's name is the default.
DEFAULT_GROUP = "pipeline.default_workload"


@dataclass(frozen=True)
class WorkloadEntry:
    name: str
    target: str  # "module:Class"
    package: str  # the distribution that declares it

    @property
    def entry_point(self) -> EntryPoint:
        return EntryPoint(self.name, self.target, GROUP)


@functools.cache
def _entries() -> dict[str, WorkloadEntry]:
    found: dict[str, WorkloadEntry] = {}
    for ep in entry_points(group=GROUP):
        package = ep.dist.name if ep.dist is not None else "?"
        if ep.name in found and found[ep.name].target != ep.value:
            raise ConfigError(
                f"workload {ep.name!r} is registered twice: by {found[ep.name].package} "
                f"({found[ep.name].target}) and by {package} ({ep.value})"
            )
        found[ep.name] = WorkloadEntry(ep.name, ep.value, package)
    return found


@functools.cache
def default_workload() -> str | None:
    """The workload of a job that names none, as this package's metadata names it (a
    plug-in's cannot change it); None when the installation names none."""
    named = [
        ep.name
        for ep in entry_points(group=DEFAULT_GROUP)
        if ep.dist is None or ep.dist.name == BUILT_IN
    ]
    return named[0] if named else None


def names() -> list[str]:
    """Registered workload names, the default first."""
    known = sorted(_entries())
    return sorted(known, key=lambda n: n != default_workload())


def closest(name: object) -> str | None:
    """The registered workload a name that is none is close to (a typo, another case)."""
    if not isinstance(name, str):
        return None
    import difflib

    by_lower = {n.lower(): n for n in names()}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    return by_lower[close[0]] if close else None


def did_you_mean(name: object) -> str:
    """`` (did you mean 'map'?)`` for a name close to a workload's, else ``""``: what a
    misspelled key gets too."""
    close = closest(name)
    return f" (did you mean {close!r}?)" if close and close != name else ""


def entry(name: str) -> WorkloadEntry:
    try:
        return _entries()[name]
    except KeyError:
        raise ConfigError(
            f"workload {name!r} is not known{did_you_mean(name)}; registered workloads: "
            f"{', '.join(names())} (a plug-in registers one under the entry-point group "
            f"{GROUP!r})"
        ) from None


def describe(name: str, cls: type | None = None) -> str:
    """How messages name a workload: ``workload 'x' (module:Class, from package p)``.
    With ``cls``, the class at fault: one not registered as ``name`` is named by its
    module alone."""
    e = _entries().get(name)
    if cls is not None and (e is None or e.target != f"{cls.__module__}:{cls.__qualname__}"):
        return f"workload {name!r} ({cls.__module__}:{cls.__qualname__})"
    return f"workload {name!r}" + (f" ({e.target}, from package {e.package})" if e else "")


@functools.cache
def load(name: str):
    """The workload class registered as ``name``; a clear error when it cannot be imported."""
    e = entry(name)
    try:
        cls = e.entry_point.load()
    except Exception as exc:
        raise ConfigError(
            f"{describe(name)} cannot be imported: {type(exc).__name__}: {exc}"
        ) from exc
    for attribute in ("settings_class", "from_settings", "run_task", "kind"):
        if not hasattr(cls, attribute):
            raise ConfigError(
                f"{describe(name)} is not a pipeline workload: it has no {attribute!r}"
            )
    from .config.options import RunOptions
    from .config.settings import settings_of

    run_options = {f.name for f in settings_of(RunOptions)}
    clash = sorted(f.name for f in settings_of(cls.settings_class) if f.name in run_options)
    if clash:
        # its --workers would replace the run's, for every workload's jobs
        raise ConfigError(
            f"{describe(name)}: its setting(s) {', '.join(clash)} have the name of a run "
            "option; rename them in the plug-in"
        )
    if e.package != BUILT_IN:
        _check_flag_forms(name, cls)
    return cls


def _check_flag_forms(name: str, cls) -> None:
    """A plug-in's setting named like a built-in's is parsed by each workload's own
    type, but one flag cannot both take a value and be an on/off switch: the
    plug-in's would take the built-in's ``--plots`` away from it."""
    from .config.settings import flag_name, settings_of

    mine = {f.name: f for f in settings_of(cls.settings_class)}
    for other in names():
        if other == name or entry(other).package != BUILT_IN:
            continue
        for theirs in settings_of(load(other).settings_class):
            f = mine.get(theirs.name)
            if f is None or (f.metadata["kind"] is bool) == (theirs.metadata["kind"] is bool):
                continue
            flag = flag_name(f)
            forms = (
                f"an on/off switch (--{flag}/--no-{flag})",
                f"a flag that takes a value (--{flag} VALUE)",
            )
            mine_form, their_form = forms if f.metadata["kind"] is bool else forms[::-1]
            raise ConfigError(
                f"{describe(name)}: its setting {f.name} would be {mine_form}, but the built-in "
                f"{other!r} workload's {f.name} is {their_form}; rename it in the plug-in"
            )
