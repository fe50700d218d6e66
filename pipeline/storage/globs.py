"""Globs of files, matched alike on a local disk and on S3.

The rules are those of Python's ``glob.glob(pattern, recursive=True)``, which lists
local files: ``*``, ``?`` and ``[...]`` match within one segment of a path (between
``/``), ``**`` as a whole segment matches any number of folders (none included),
and a wildcard does not match a name that starts with ``.`` unless the pattern's
segment starts with one too. S3 has no folders to glob: the keys listed under the
pattern's fixed part are matched by :func:`matches` instead.
"""

from __future__ import annotations

import fnmatch
import re

__all__ = ["fixed_start", "has_magic", "hidden", "matches", "reaches", "split"]

_MAGIC = re.compile(r"[*?[]")


def has_magic(text: str) -> bool:
    """Whether ``text`` is a glob (as ``glob.glob`` tells)."""
    return _MAGIC.search(text) is not None


def split(pattern: str) -> tuple[str, list[str]]:
    """The pattern's fixed folder (its segments before the first with a wildcard:
    ``s3://b/texts``, ``in``, ``/``, or "" for the current folder) and its segments
    from there (``["*.txt"]``)."""
    segments = pattern.split("/")
    first = next((i for i, s in enumerate(segments) if has_magic(s)), len(segments))
    folder = "/".join(segments[:first]) or ("/" if pattern.startswith("/") else "")
    return folder, segments[first:]


def fixed_start(segments: list[str]) -> str:
    """The text every match begins with below the fixed folder (``f0`` for
    ``f0*.txt``): what an S3 listing can be limited to."""
    head = segments[0] if segments else ""
    match = _MAGIC.search(head)
    return head[: match.start()] if match else head


def matches(segments: list[str], names: list[str]) -> bool:
    """Whether a file whose path below the pattern's fixed folder is ``names``
    (``["sub", "a.txt"]``) matches the pattern's ``segments`` (from :func:`split`)."""
    if not segments:
        return not names
    head, rest = segments[0], segments[1:]
    if head == "**":
        return matches(rest, names) or (
            bool(names) and not hidden(names[0]) and matches(segments, names[1:])
        )
    return bool(names) and _segment(head, names[0]) and matches(rest, names[1:])


def reaches(segments: list[str], names: list[str]) -> bool:
    """Whether the pattern's ``segments`` may match files below the folder whose path
    below the pattern's fixed folder is ``names`` (its files are not listed: what they
    will be is not known yet, such as a job's output)."""
    if not names:
        return bool(segments)
    if not segments:
        return False
    head = segments[0]
    if head == "**":
        return reaches(segments[1:], names) or (
            not hidden(names[0]) and reaches(segments, names[1:])
        )
    return _segment(head, names[0]) and reaches(segments[1:], names[1:])


def _segment(pattern: str, name: str) -> bool:
    if not has_magic(pattern):
        return pattern == name
    if hidden(name) and not pattern.startswith("."):
        return False  # as glob.glob leaves it out
    return fnmatch.fnmatchcase(name, pattern)


def hidden(name: str) -> bool:
    """A hidden name (a dot first), which glob.glob's wildcards and ``**`` leave out."""
    return name.startswith(".")
