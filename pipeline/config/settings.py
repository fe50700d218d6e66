"""Settings: dataclass fields that are also CLI flags, job-file keys and environment
variables, and how a value given in any of those forms is checked and converted."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import tomllib
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["ENV_PREFIX", "RowsFile", "check_settings", "coerce", "env_name", "flag_name",
           "names_in_scope", "setting", "settings_of", "split_list"]  # fmt: skip

ENV_PREFIX = "PIPELINE_"
#: What a setting belongs to (see :func:`setting`), the narrowest last.
SCOPES = ("job", "cluster", "connection", "remote")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclasses.dataclass(frozen=True)
class RowsFile:
    """A ``rows`` setting given as a .csv or .parquet file: its absolute path, checked
    here to be a table of at least one row. Its rows are read where they are used, a
    part at a time: ten million rows held as Python values took 4.6 GB."""

    path: str
    #: Where it was given ("--grid: file points.csv"), to begin messages with.
    origin: str = field(default="", compare=False)

    @property
    def suffix(self) -> str:
        return Path(self.path).suffix.lower()


def setting(
    default: Any,
    kind: type,
    help: str,
    *,
    choices: tuple | None = None,
    minimum: float | None = None,
    below: float | None = None,
    sequence: bool = False,
    rows: bool = False,
    scope: str = "job",
):
    """A dataclass field that is also a CLI flag, a job-file key and an env var.

    A ``sequence`` setting is a comma-separated string on the command line and in
    the environment; a job file may give it as a TOML list (or, for ``k=v``
    options, a table), which becomes that same string. A table setting with
    ``rows`` may also be a list of tables (rows): TOML's ``[[name]]``, a JSON list,
    or a .csv or .parquet file of them (a :class:`RowsFile`).

    ``scope`` says what the setting belongs to: a ``"job"`` (each job of a run its
    own), the ``"cluster"`` the run's jobs share, the ``"connection"`` to it
    (:func:`pipeline.connect` takes those), or a ``"remote"`` cluster alone (the
    scheduler's address and TLS files, which the embedded cluster has no use for).
    Each scope is within the next: remote < connection < cluster.
    """
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r} is not a setting's scope, expected one of {SCOPES}")
    meta = {
        "kind": kind,
        "help": help,
        "choices": choices,
        "minimum": minimum,
        "below": below,
        "sequence": sequence,
        "rows": rows,
        "scope": scope,
    }
    return field(default=default, metadata=meta)


def settings_of(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "kind" in f.metadata]


def names_in_scope(cls, scope: str) -> tuple[str, ...]:
    """The names of ``cls``'s settings within ``scope`` (``"cluster"`` takes in the
    connection's and the remote cluster's)."""
    within = SCOPES[SCOPES.index(scope) :]
    return tuple(f.name for f in settings_of(cls) if f.metadata["scope"] in within)


def check_settings(obj) -> None:
    """Check a settings object built in Python (``CubeJob(cubes=0)``) as flags, job
    files and variables are checked: each value given (not None) of its kind, within
    its minimum and choices. A path given for text and a numpy number are stored as
    ``str`` and ``int``/``float`` (what job records hold), a table given as text (JSON
    or a file's path) as what :func:`coerce` reads; other values as given."""
    for f in settings_of(type(obj)):
        value, kind = getattr(obj, f.name), f.metadata["kind"]
        if value is None or value == f.default:
            continue
        if kind in (str, dict) and isinstance(value, os.PathLike):
            value = os.fspath(value)
        elif (
            kind in (int, float)
            and isinstance(value, numbers.Real)
            and not isinstance(value, bool)
            and kind(value) == value
        ):
            value = kind(value)  # numpy's integers and floats, 5.0 for an integer
        checked = coerce(f, value, f"{type(obj).__name__}({f.name}={value!r})")
        if kind is dict and isinstance(value, str):  # JSON, or a file (of rows: RowsFile)
            value = checked
        object.__setattr__(obj, f.name, value)  # frozen dataclasses: in __post_init__


def flag_name(f: dataclasses.Field) -> str:
    return f.name.replace("_", "-")


def env_name(f: dataclasses.Field) -> str:
    return ENV_PREFIX + f.name.upper()


def coerce(f: dataclasses.Field, value: Any, origin: str, *, from_text: bool = False) -> Any:
    """Check and convert one value; ``origin`` says where it came from, for messages.

    Only environment variables are text to parse: a job file has types of its own.
    """
    kind, choices, minimum = f.metadata["kind"], f.metadata["choices"], f.metadata["minimum"]
    if f.metadata.get("sequence") and isinstance(value, list | dict):
        value = _sequence_text(value)
    if f.metadata.get("sequence") and isinstance(value, str):
        _check_listed_once(value, origin)
    expected = {
        int: "an integer",
        float: "a number",
        bool: "true or false",
        str: "a string",
        dict: "a table (in a job file) or a JSON object",
    }[kind]
    rows = f.metadata.get("rows", False)
    if rows:
        expected = "a table or a list of tables (in a job file), or JSON of either"
    if kind is dict and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            if not Path(value).is_file():
                files = ".toml, .json, .csv or .parquet file" if rows else ".toml or .json file"
                if Path(value).suffix.lower() in (".toml", ".json", ".csv", ".parquet"):
                    raise ConfigError(f"{origin}: file {value} does not exist") from None
                raise ConfigError(
                    f"{origin}: {value!r} is not {expected} (or a {files} of one): {exc}"
                ) from None
            value = _table_file(Path(value), f.name, origin, rows)
    elif from_text and kind is not str:
        text = value.strip().lower()
        try:
            if kind is bool:
                if text not in _TRUE | _FALSE:
                    raise ValueError(text)
                value = text in _TRUE
            else:
                value = kind(text)
        except ValueError:
            raise ConfigError(f"{origin}: {value!r} is not {expected}") from None
    if rows and isinstance(value, list | tuple):
        return _table_rows(value, origin)
    if rows and isinstance(value, RowsFile):
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{origin}: expected {expected}, got {value!r} ({type(value).__name__})")
    if kind is float and not math.isfinite(value):
        # nan passed `minimum` (every comparison with it is false) and hung the run
        raise ConfigError(f"{origin}: {value!r} is not a finite number")
    if choices is not None and value not in choices:
        # 'Poisson' (statsmodels' class name) or 'hc1' mean the choice they spell
        same = [c for c in choices if isinstance(value, str) and str(c).lower() == value.lower()]
        if len(same) != 1:
            raise ConfigError(f"{origin}: {value!r} is not one of {', '.join(map(str, choices))}")
        value = same[0]
    if minimum is not None and value < minimum:
        raise ConfigError(f"{origin}: {value!r} must be at least {minimum}")
    below = f.metadata.get("below")
    if below is not None and value >= below:
        raise ConfigError(f"{origin}: {value!r} must be less than {below}")
    return value


def split_list(value: str | None) -> tuple[str, ...]:
    """A list setting's names: ``"a, b"`` or ``["a", "b"]`` -> ``("a", "b")``."""
    if value is None:
        return ()
    if isinstance(value, list | tuple):
        return tuple(str(v).strip() for v in value if str(v).strip())
    return tuple(p.strip() for p in str(value).split(",") if p.strip())


def read_text(path: Path) -> str:
    """A settings file's text, UTF-8 with or without the byte-order mark that Windows
    editors write (tomllib refuses the mark; it reads their CRLF line ends itself)."""
    return path.read_bytes().decode("utf-8-sig")


def _table_file(path: Path, name: str, origin: str, rows: bool = False) -> dict | list:
    """A table setting given as a file: JSON, or TOML whose table ``[name]`` (a job
    file's own) or else whole document is the value; with ``rows``, also a list of
    tables (``[[name]]`` in TOML, a JSON list) or a .csv or .parquet file of rows (a
    :class:`RowsFile`, its rows not read here)."""
    suffix = path.suffix.lower()
    try:
        if rows and suffix in (".csv", ".parquet"):
            if not _has_rows(path):
                raise ConfigError(
                    f"{origin}: file {path} has no rows; expected a row per call "
                    "(a header line and at least one row, for a CSV)"
                )
            return RowsFile(str(path.resolve()), f"{origin}: file {path}")
        if suffix == ".json":
            value = json.loads(read_text(path))
        else:
            value = tomllib.loads(read_text(path))
            if isinstance(value.get(name), dict) or (rows and isinstance(value.get(name), list)):
                value = value[name]
    except ConfigError:  # (a ValueError too) already names the file
        raise
    except (ValueError, OSError) as exc:  # TOMLDecodeError and JSONDecodeError too
        raise ConfigError(f"{origin}: file {path} is not a table: {exc}") from None
    if rows and isinstance(value, list):
        return _table_rows(value, f"{origin}: file {path}")
    if not isinstance(value, dict):
        raise ConfigError(f"{origin}: file {path} holds {type(value).__name__}, not a table")
    return value


def _has_rows(path: Path) -> bool:
    """Whether a .csv or .parquet file holds a row: from a parquet file's footer, a
    CSV's first block (the whole file is read by the job that uses it)."""
    import pyarrow as pa

    try:
        if path.suffix.lower() == ".csv":
            from pyarrow import csv

            # (on the calling thread: a pyarrow pool thread alive at exit aborts the process)
            reader = csv.open_csv(path, read_options=csv.ReadOptions(use_threads=False))
            return any(batch.num_rows for batch in reader)
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows > 0
    except pa.ArrowException as exc:
        raise ValueError(str(exc)) from None


def _table_rows(value: list | tuple, origin: str) -> list[dict]:
    """A list of tables (rows), each checked to be a table."""
    if not value:
        raise ConfigError(f"{origin}: an empty list; expected at least one table")
    for i, row in enumerate(value):
        if not isinstance(row, Mapping):
            raise ConfigError(
                f"{origin}: item {i} is {row!r} ({type(row).__name__}); expected a list "
                "of tables, one per call"
            )
    return [dict(row) for row in value]


def _check_listed_once(text: str, origin: str) -> None:
    """A column (or ``k=v`` option) listed twice is refused: ``chunk_by = "a,a"``
    reached pyarrow as a traceback, and ``columns = "y,y"`` gave the function two
    ``y`` columns."""
    seen: set[str] = set()
    for part in text.split(","):
        name = part.partition("=")[0].strip()
        if name in seen:
            raise ConfigError(f"{origin}: {name!r} is listed twice; list it once")
        if name:
            seen.add(name)


def _sequence_text(value: list | dict) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return ",".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in value.items())
