"""Commands of this interpreter for a test's subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def venv_commands(bin_dir: Path) -> Path:
    """Write ``python`` and ``pipeline`` wrappers for this interpreter into ``bin_dir``.

    Scripts that exec ``sys.executable``, not symlinks to it: a venv's interpreter
    started through a symlink outside the venv does not see the venv's packages.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, args in (("python", ""), ("python3", ""), ("pipeline", " -m pipeline")):
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}"{args} "$@"\n')
        wrapper.chmod(0o755)
    return bin_dir


def pipeline_command(*args, paths=(), env=None, timeout=240) -> subprocess.CompletedProcess:
    """``pipeline ARGS`` run by this interpreter, with the checkout (and ``paths``:
    folders of plug-ins, say) on its import path; its output captured as text."""
    path = os.pathsep.join(str(p) for p in (*paths, REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {}), "PYTHONPATH": path},
    )
