"""Process trees for the tests that check nothing outlives a run: a process's descendants
read from /proc."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running."""
    return {p for p in pids if Path(f"/proc/{p}").exists()}


def session_alive(sid: int) -> bool:
    """Whether a process of session ``sid`` (its leader started with
    ``start_new_session``) is still there."""
    try:
        os.killpg(sid, 0)
    except ProcessLookupError:
        return False
    return True


def command_line(pid: int) -> str:
    """The process's command line, its arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
