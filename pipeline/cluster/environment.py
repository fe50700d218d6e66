"""The Dask processes' environment, written once in ``worker.env`` (package data) for
every deployment: the image, Compose, the Terraform module and the embedded cluster."""

from __future__ import annotations

import re
from importlib import resources

#: The file's name beside this module.
SOURCE = "worker.env"

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env(text: str, source: str = SOURCE) -> dict[str, str]:
    """``KEY=VALUE`` lines of ``text``, blank and ``#`` lines skipped. A value is taken
    as it stands, so one that another reader would change (quotes, spaces) is refused:
    docker --env-file, Compose and Terraform must all read the same."""
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, value = line.partition("=")
        if not _KEY.fullmatch(key) or not value or value[0] in "'\"" or re.search(r"\s", value):
            raise ValueError(f"{source} line {number}: not KEY=VALUE, a bare value: {line!r}")
        if key in env:
            raise ValueError(f"{source} line {number}: {key} again")
        env[key] = value
    return env


def worker_env() -> dict[str, str]:
    """Every variable of ``worker.env``, in the file's order."""
    return parse_env(resources.files(__package__).joinpath(SOURCE).read_text())


def process_env() -> dict[str, str]:
    """The variables native libraries read when a process starts (BLAS threads, glibc's
    malloc): what an embedded worker takes from ``worker.env``. Dask's and pipeline's
    settings (``DASK_*``, ``PIPELINE_*``) are not: the embedded cluster chooses its own,
    through ``dask.config``."""
    return {k: v for k, v in worker_env().items() if not k.startswith(("DASK_", "PIPELINE_"))}
