"""Configuration: one resolution order, in one place, into frozen dataclasses.

Every setting is a dataclass field with its help text. It can be given as a CLI
flag (``--cubes-per-shard``), a job-file key (``cubes_per_shard``) or an
environment variable (``PIPELINE_CUBES_PER_SHARD``); the first of those that is
set wins, in that order, then the field's default.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "JobFile",
    "ProcessSettings",
    "RunOptions",
    "load_job_file",
    "process_settings",
    "resolve",
    "setting",
    "settings_of",
]

ENV_PREFIX = "PIPELINE_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


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
):
    """A dataclass field that is also a CLI flag, a job-file key and an env var.

    A ``sequence`` setting is a comma-separated string on the command line and in
    the environment; a job file may give it as a TOML list (or, for ``k=v``
    options, a table), which becomes that same string. A table setting with
    ``rows`` may also be a list of tables (rows): TOML's ``[[name]]``, a JSON list,
    or a .csv or .parquet file of them.
    """
    meta = {
        "kind": kind,
        "help": help,
        "choices": choices,
        "minimum": minimum,
        "below": below,
        "sequence": sequence,
        "rows": rows,
    }
    return field(default=default, metadata=meta)


def settings_of(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "kind" in f.metadata]


def check_settings(obj) -> None:
    """Check a settings object built in Python (``CubeJob(cubes=0)``) as flags, job
    files and variables are checked: each value given (not None) of its kind, within
    its minimum and choices. A path given for text and a numpy number are stored as
    ``str`` and ``int``/``float`` (what job records hold); other values as given."""
    for f in settings_of(type(obj)):
        value, kind = getattr(obj, f.name), f.metadata["kind"]
        if value is None or value == f.default:
            continue
        if kind is str and isinstance(value, os.PathLike):
            value = os.fspath(value)
        elif (
            kind in (int, float)
            and isinstance(value, numbers.Real)
            and not isinstance(value, bool)
            and kind(value) == value
        ):
            value = kind(value)  # numpy's integers and floats, 5.0 for an integer
        _coerce(f, value, f"{type(obj).__name__}({f.name}={value!r})")
        object.__setattr__(obj, f.name, value)  # frozen dataclasses: in __post_init__


def flag_name(f: dataclasses.Field) -> str:
    return f.name.replace("_", "-")


def env_name(f: dataclasses.Field) -> str:
    return ENV_PREFIX + f.name.upper()


#: Run settings naming files the driver writes or reads on its own disk.
_LOCAL_FILES = ("report", "profile", "profile_tasks", "price_file")


@dataclass(frozen=True)
class RunOptions:
    """How a job runs: where, with what parallelism, writing where."""

    #: A setting of the embedded cluster, outranked by a remote scheduler: a workers
    #: count exported for the embedded cluster gives way to a job's scheduler.
    APPLIES_WITHOUT: ClassVar = {"workers": "scheduler"}

    def __post_init__(self) -> None:
        check_settings(self)
        if self.scheduler and self.workers:
            # (it was ignored without a word: the run said "on 2 workers")
            raise ConfigError(
                f"workers = {self.workers} (--workers, PIPELINE_WORKERS) sizes the embedded "
                f"cluster; the cluster at scheduler = {self.scheduler!r} has the workers "
                "started for it (add some with `dask worker`): leave workers out"
            )
        for name in _LOCAL_FILES:
            value = getattr(self, name)
            if isinstance(value, str) and "://" in value:
                # Written with open(): an s3:// URL became a local folder named "s3:".
                raise ConfigError(
                    f"{name} = {value!r} (--{name.replace('_', '-')}): a local path is "
                    "expected, on the driver's disk (the job's output may be on S3)"
                )

    scheduler: str | None = setting(
        None,
        str,
        "Address of an existing Dask scheduler (tcp://, tls://). "
        "Unset: start an embedded local cluster.",
    )
    workers: int | None = setting(
        None,
        int,
        "Workers of the embedded cluster (one thread each). Default: one per core.",
        minimum=1,
    )
    output: str = setting("results", str, "Where results go: a directory or s3://bucket/prefix.")
    overwrite: bool = setting(
        False, bool, "Delete the job's previous output and start over instead of resuming."
    )
    units_per_task: int | None = setting(
        None,
        int,
        "Units (cubes, chunks) per Dask task, rounded up to whole shards for cubes. "
        "Default: measured on the job's first tasks, so each task lasts about --task-seconds.",
        minimum=1,
    )
    task_seconds: float = setting(
        1.0, float, "Target duration of one task when sizing tasks.", minimum=0.01
    )
    max_failures: int = setting(
        0, int, "Exit non-zero when more units than this failed.", minimum=0
    )
    report: str | None = setting(
        None,
        str,
        "Directory for Dask's performance report (HTML), a JSON summary and a report page "
        "(HTML: cost, throughput, task durations, workers' timeline, failures, plan) of each job.",
    )
    profile: str | None = setting(None, str, "Write a cProfile of the driver to this file.")
    instance_type: str = setting(
        "c5.24xlarge",
        str,
        "Instance type whose price (over its vCPUs, one worker each) costs a run's "
        "worker-seconds; see pipeline/prices.toml.",
    )
    price_per_worker_hour: float | None = setting(
        None, float, "Dollars per worker-hour, instead of the instance type's price.", minimum=0
    )
    price_file: str | None = setting(
        None, str, "A TOML price table (the format of pipeline/prices.toml) to use instead."
    )
    profile_tasks: str | None = setting(
        None,
        str,
        "Profile every task on the workers and write the merged cProfile statistics to this "
        "file ({job} is replaced by the job id). View: python -m pstats FILE.",
    )
    progress: bool | None = setting(
        None, bool, "Show a progress bar (default: when stderr is a terminal)."
    )
    dashboard: bool = setting(
        False,
        bool,
        "Serve Dask's dashboard from the embedded cluster (its link is printed; starting "
        "it costs about 0.7 s). A remote scheduler serves its own.",
    )
    tls_ca_file: str | None = setting(None, str, "CA certificate for TLS to the scheduler.")
    tls_cert: str | None = setting(None, str, "Client certificate for TLS.")
    tls_key: str | None = setting(None, str, "Client private key for TLS.")
    direct_to_workers: bool = setting(
        False,
        bool,
        "Fetch results straight from workers instead of through the scheduler "
        "(only when the driver can reach every worker's address).",
    )


@dataclass(frozen=True)
class ProcessSettings:
    """Settings every process (the driver and each worker) reads from its own
    environment: on a remote cluster, set them where the workers start."""

    s3_endpoint_url: str | None = setting(
        None,
        str,
        "An S3-compatible endpoint (http:// or https://); boto3's AWS_ENDPOINT_URL also works.",
    )
    s3_retry_mode: str = setting("standard", str, "botocore's retry mode: standard or adaptive.")
    s3_max_attempts: int = setting(10, int, "botocore's attempts per S3 request.", minimum=1)
    cache_dir: str | None = setting(
        None,
        str,
        "Where workers cache the frames' layout (default ~/.cache/pipeline; off disables).",
    )


def process_settings(environ: Mapping[str, str] | None = None) -> ProcessSettings:
    """The :class:`ProcessSettings` of this process, from its ``PIPELINE_*`` variables."""
    return resolve(ProcessSettings, None, {}, environ)


@dataclass(frozen=True)
class JobFile:
    """The raw content of one job file: its path, workload name and keys."""

    path: Path | None
    workload: str
    values: Mapping[str, Any]

    @property
    def stem(self) -> str | None:
        return self.path.stem if self.path else None


def load_job_file(path: str | os.PathLike, default_workload: str) -> JobFile:
    """A job file's keys; its ``workload`` (or ``default_workload``) is checked when the
    workload is loaded from the registry."""
    p = Path(path)
    try:
        data = tomllib.loads(_text(p))
    except FileNotFoundError:
        from . import registry

        hint = ""
        if str(path) in registry.names():
            hint = f" (to run the {path} workload from flags alone: --workload {path})"
        elif str(path).lower() in ("true", "false", "yes", "no", "on", "off"):
            # `--progress false`: an on/off flag takes no value, so the word became a file
            hint = " (an on/off flag such as --overwrite takes no value; --no-overwrite is off)"
        raise ConfigError(f"job file {p}: no such file{hint}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"job file {p}: not valid TOML: {exc}") from None
    if not data:  # an empty file ran the default job: 1,000 cubes, 8 GB written
        from . import registry

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
    from . import registry

    if workload not in registry.names():
        raise ConfigError(
            f"job file {p}: workload = {workload!r} is not known, "
            f"expected one of {', '.join(registry.names())}"
        )
    return JobFile(p, workload, data)


def _coerce(f: dataclasses.Field, value: Any, origin: str, *, from_text: bool = False) -> Any:
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


def _text(path: Path) -> str:
    """A settings file's text, UTF-8 with or without the byte-order mark that Windows
    editors write (tomllib refuses the mark; it reads their CRLF line ends itself)."""
    return path.read_bytes().decode("utf-8-sig")


def _table_file(path: Path, name: str, origin: str, rows: bool = False) -> dict | list:
    """A table setting given as a file: JSON, or TOML whose table ``[name]`` (a job
    file's own) or else whole document is the value; with ``rows``, also a list of
    tables (``[[name]]`` in TOML, a JSON list) or the rows of a .csv or .parquet file."""
    suffix = path.suffix.lower()
    try:
        if rows and suffix in (".csv", ".parquet"):
            listed = _file_rows(path)
            if not listed:
                raise ConfigError(
                    f"{origin}: file {path} has no rows; expected a row per call "
                    "(a header line and at least one row, for a CSV)"
                )
            return _table_rows(listed, f"{origin}: file {path}")
        if suffix == ".json":
            value = json.loads(_text(path))
        else:
            value = tomllib.loads(_text(path))
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


def _file_rows(path: Path) -> list[dict]:
    import pyarrow as pa

    try:
        if path.suffix.lower() == ".csv":
            from pyarrow import csv

            return _empty_text_as_null(csv.read_csv(path)).to_pylist()
        from .storage import read_parquet

        return read_parquet(path.read_bytes()).to_pylist()
    except pa.ArrowException as exc:
        raise ValueError(str(exc)) from None


def _empty_text_as_null(table):
    """An empty CSV cell as missing (None) in a text column, as pyarrow reads it in a
    number column: a point's ``b=''`` beside ``c=None`` for the same empty cell. (Not
    through pyarrow's ``strings_can_be_null``: it would take text such as "NA" or
    "null" for missing too.)"""
    import pyarrow as pa
    import pyarrow.compute as pc

    for i, column in enumerate(table.columns):
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            empty = pc.equal(column, "")
            table = table.set_column(
                i, table.field(i), pc.if_else(empty, pa.scalar(None, column.type), column)
            )
    return table


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
                values[f.name] = _coerce(f, given, f"--{flag_name(f)}", from_text=text)
            elif job is not None and f.name in job.values:
                given = job.values[f.name]
                values[f.name] = _coerce(f, given, f"job file {job.path}: key {f.name!r}")
            elif environ.get(env_name(f), "") != "":
                given = environ[env_name(f)]
                values[f.name] = _coerce(f, given, f"environment {env_name(f)}", from_text=True)
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
