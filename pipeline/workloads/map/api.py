"""``pipeline.map``: a ``map`` job from Python, its function passed by value."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence

from ...errors import ConfigError
from .job import MapJob
from .usercode import describe_function
from .workload import MapWorkload

__all__ = ["map_job"]


def map_job(
    fn: Callable,
    *,
    data: str | os.PathLike | None = None,
    grid: Mapping[str, list] | Sequence[Mapping] | str | os.PathLike | None = None,
    files: str | os.PathLike | None = None,
    output: str | os.PathLike | None = None,
    name: str | None = None,
    client=None,
    **settings,
):
    """``pipeline.map``'s job: the workload that calls ``fn`` per unit of one input,
    writing the rows it returns under ``output``, and the run's options (the driver
    runs it, on the embedded cluster or ``client``'s).

    ``grid`` is a mapping of lists (each combination; a ``range`` is held as one, not
    listed) or a sequence of mappings or a pandas DataFrame (each point, in order), or
    the path of a .csv or .parquet file of points (each row, in order).
    ``fn`` may be defined in the calling script (it travels by value). ``settings``
    are the map job's (``chunk_by``, ``chunk_rows``, ``columns``, ``seed``,
    ``retries``) and the run's (``workers``, ``overwrite``, ``max_failures``, ...).
    A second call resumes: only units not yet done, or that raised, run. Settings not
    given come from ``PIPELINE_*`` variables, as for ``pipeline run`` (``output``
    from ``PIPELINE_OUTPUT``, else ``results``).
    """
    from ...config import CONNECTION_SETTINGS, RunOptions, resolve, settings_of

    run_keys = {f.name for f in settings_of(RunOptions)}
    map_keys = {f.name for f in settings_of(MapJob)}
    unknown = sorted(set(settings) - run_keys - map_keys)
    if unknown:
        raise ConfigError(f"pipeline.map: unknown setting(s) {', '.join(unknown)}")
    ignored = [k for k in CONNECTION_SETTINGS if settings.get(k) is not None]
    if client is not None and ignored:
        # The run is on client's cluster: they would have been ignored, unsaid.
        given = ", ".join(f"{k}={settings[k]!r}" for k in ignored)
        raise ConfigError(
            f"pipeline.map: {given} set up a cluster, but client= gives the cluster to run "
            "on; leave them out (or the client, to have pipeline.map start or reach one)"
        )
    if hasattr(data, "columns") and hasattr(data, "to_parquet"):
        raise ConfigError(
            "pipeline.map: data= is a parquet file, folder or s3:// prefix, not a DataFrame: "
            "write it with df.to_parquet(path) first (or give grid=df: a call per row)"
        )
    # (paths as pathlib.Path: refused as "--output: expected a string, got PosixPath")
    settings = {k: _text(v) for k, v in settings.items()}
    given = {
        "name": name,
        "function": describe_function(fn),
        "data": _text(data),
        "grid": _grid_value(grid),
        "files": _text(files),
        **{k: v for k, v in settings.items() if k in map_keys},
    }
    job = resolve(MapJob, None, given)
    run_given = {k: v for k, v in settings.items() if k in run_keys}
    options = resolve(RunOptions, None, {"output": _text(output), **run_given})
    workload = MapWorkload(job, name or _default_name(fn), fn=fn, output=options.output)
    return workload, options


def _default_name(fn: Callable) -> str:
    """The job's folder when no name is given: the function's name, as a folder name
    (a lambda's '<lambda>' would make a folder named with angle brackets)."""
    while isinstance(fn, functools.partial):  # partial(fit, alpha=2): 'fit'
        fn = fn.func
    name = re.sub(r"[^\w.-]", "", getattr(fn, "__name__", "")).lstrip("._")
    return name or "map"


def _text(path):
    return os.fspath(path) if isinstance(path, os.PathLike) else path


def _grid_value(grid) -> dict | list | str | None:
    if grid is None:
        return None
    if isinstance(grid, str | os.PathLike):  # a file of points, or JSON
        return os.fspath(grid)
    if isinstance(grid, Mapping):
        return dict(grid)
    if hasattr(grid, "to_dict") and hasattr(grid, "columns"):  # a DataFrame of points
        return grid.to_dict("records")
    return [dict(point) if isinstance(point, Mapping) else point for point in grid]
