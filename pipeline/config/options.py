"""The run's settings (:class:`RunOptions`) and those every process reads from its own
environment (:class:`ProcessSettings`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from .resolve import resolve
from .settings import check_settings, names_in_scope, setting

__all__ = ["CONNECTION_SETTINGS", "ProcessSettings", "RunOptions", "connection_options",
           "process_settings"]  # fmt: skip


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
            # Refused, not ignored: the run would report workers it does not have.
            raise ConfigError(
                f"workers = {self.workers} (--workers, PIPELINE_WORKERS) sizes the embedded "
                f"cluster; the cluster at scheduler = {self.scheduler!r} has the workers "
                "started for it (add some with `dask worker`): leave workers out"
            )
        if isinstance(self.output, str) and not self.output.removeprefix("file://").strip():
            # A local path of '' is the working folder: the job's folder and the output's
            # own (_locks, inputs) among the user's files
            raise ConfigError(
                f"output = {self.output!r} (--output) names no place; give a folder or "
                "s3://bucket/prefix (unset: results)"
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
        scope="remote",
    )
    workers: int | None = setting(
        None,
        int,
        "Workers of the embedded cluster (one thread each). Default: one per core.",
        minimum=1,
        scope="connection",
    )
    output: str = setting("results", str, "Where results go: a directory or s3://bucket/prefix.")
    overwrite: bool = setting(
        False, bool, "Delete the job's previous output and start over instead of resuming."
    )
    keep_done: bool = setting(
        False,
        bool,
        "Resume after a code fix, keeping the units done.",
    )
    units_per_task: int | None = setting(
        None,
        int,
        "Units per task. Default: sized on the job's first tasks to last --task-seconds.",
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
        "Directory for each job's report page (HTML), JSON summary and Dask's report.",
    )
    profile: str | None = setting(
        None, str, "Write a cProfile of the driver to this file.", scope="cluster"
    )
    instance_type: str = setting(
        "c5.24xlarge",
        str,
        "The instance whose $/h over its vCPUs prices any run's worker-seconds.",
    )
    price_per_worker_hour: float | None = setting(
        None, float, "Dollars per worker-hour, instead of the instance type's price.", minimum=0
    )
    price_file: str | None = setting(
        None, str, "A TOML price table (the format of pipeline/costs/prices.toml) to use instead."
    )
    profile_tasks: str | None = setting(
        None,
        str,
        "Profile every task; merged cProfile statistics to this file ({job}: the job id).",
    )
    progress: bool | None = setting(
        None,
        bool,
        "Show progress: a bar on a terminal, else lines (--progress-seconds).",
    )
    progress_seconds: float = setting(
        10.0,
        float,
        "Seconds between progress lines (0: at each 10 % of the units alone).",
        minimum=0,
    )
    dashboard: bool = setting(
        False,
        bool,
        "Serve the embedded cluster's Dask dashboard and print its link (0.7 s more start-up).",
        scope="connection",
    )
    tls_ca_file: str | None = setting(
        None, str, "CA certificate for TLS to the scheduler.", scope="remote"
    )
    tls_cert: str | None = setting(None, str, "Client certificate for TLS.", scope="remote")
    tls_key: str | None = setting(None, str, "Client private key for TLS.", scope="remote")
    direct_to_workers: bool = setting(
        False,
        bool,
        "Fetch results from workers, not via the scheduler (the driver must reach every worker).",
        scope="connection",
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
    drain_seconds: float = setting(
        50.0,
        float,
        "How long a worker asked to leave (SIGTERM) lets its running tasks finish before "
        "it stops (with the nanny preload pipeline.cluster.drain).",
        minimum=0,
    )


def process_settings(environ: Mapping[str, str] | None = None) -> ProcessSettings:
    """The :class:`ProcessSettings` of this process, from its ``PIPELINE_*`` variables."""
    return resolve(ProcessSettings, None, {}, environ)


#: The run settings that say which cluster a job runs on (one cluster for a batch).
CONNECTION_SETTINGS = names_in_scope(RunOptions, "connection")


def connection_options(options: RunOptions | None, settings: dict) -> RunOptions:
    """:func:`pipeline.connect`'s settings: ``options``, or the keyword ``settings``
    (of :data:`CONNECTION_SETTINGS`) over the ``PIPELINE_*`` variables."""
    if options is not None:
        if not isinstance(options, RunOptions):
            raise ConfigError(
                f"pipeline.connect(): options is {type(options).__name__}, expected a "
                "RunOptions (or settings as keywords: pipeline.connect(workers=2))"
            )
        if settings:
            raise ConfigError(
                f"pipeline.connect(): {', '.join(sorted(settings))} given beside a RunOptions; "
                "give the settings one way"
            )
        return options
    unknown = sorted(set(settings) - set(CONNECTION_SETTINGS))
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], CONNECTION_SETTINGS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"pipeline.connect(): {', '.join(unknown)} is not a connection's setting{hint}; "
            f"those are {', '.join(CONNECTION_SETTINGS)} (the others are a job's)"
        )
    try:
        return resolve(RunOptions, None, settings)
    except ConfigError as exc:
        raise ConfigError(f"pipeline.connect(): {exc}") from None
