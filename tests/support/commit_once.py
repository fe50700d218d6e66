"""What the commit-once tests (tests/test_commit_once*.py) share: the ``pipeline``
command run from this checkout, and whether the workers are done with every task."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def pipeline_command(*args: str) -> subprocess.CompletedProcess:
    """``python -m pipeline ARGS`` (this checkout's, with the tests' modules
    importable), its output captured."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip


def idle(client) -> bool:
    """No worker runs a task (a released one included: its thread runs to its end)."""
    return not any(client.run(lambda dask_worker: len(dask_worker.state.executing)).values())
