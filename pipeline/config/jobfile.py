"""Job files: a TOML file's keys and the workload it runs."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import registry
from ..errors import ConfigError
from .settings import read_text

__all__ = ["JobFile", "load_job_file"]


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
