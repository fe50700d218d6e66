"""A job file's content: its keys and the workload it runs (read by `jobs.load_job_file`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["JobFile"]


@dataclass(frozen=True)
class JobFile:
    """The raw content of one job file: its path, workload name and keys."""

    path: Path | None
    workload: str
    values: Mapping[str, Any]

    @property
    def stem(self) -> str | None:
        return self.path.stem if self.path else None
