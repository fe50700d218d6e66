"""Commands of this interpreter for a test's subprocesses."""

from __future__ import annotations

import sys
from pathlib import Path


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
