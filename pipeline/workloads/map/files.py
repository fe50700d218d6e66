"""The files of a ``map`` job's ``files`` input, each with its version (size and
modification time, or size and S3 ETag, as a dataset's files have: a resume after
one changed is refused).

``files`` is a folder (every file below it), a file, an ``s3://`` prefix (taken as a
folder) or a glob, local or on S3, matched by the same rules (:mod:`pipeline.storage.globs`).
Names starting with ``.`` are left out, unless named.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from ...errors import ConfigError, InputError
from ...storage import is_remote, open_store
from ...storage.globs import fixed_start, has_magic, hidden, matches, split
from ...storage.local import file_version

__all__ = ["list_files"]


def list_files(where: str) -> list[tuple[str, str]]:
    """``(path, version)`` of each file ``where`` names, in path order; an error that
    says what was looked for when there is none."""
    if not where.strip():
        # (a Path of '' is the working folder: every file below it, outputs included)
        raise InputError("no files given: set files (--files FOLDER, a glob or s3://bucket/prefix)")
    try:
        found = _in_object_store(where) if is_remote(where) else _local(where)
    except OSError as exc:  # (StorageError too)
        raise InputError(f"files = {where!r}: cannot list it: {exc}") from exc
    return found


def _local(where: str) -> list[tuple[str, str]]:
    if has_magic(where):
        paths = sorted(os.path.abspath(p) for p in glob.glob(where, recursive=True)
                       if os.path.isfile(p))  # fmt: skip
        if not paths:
            raise InputError(f"files = {where!r}: no files match this glob")
        return [(p, file_version(p)) for p in paths]
    root = Path(where).expanduser()
    if root.is_file():
        paths = [str(root.resolve())]
    elif root.is_dir():
        paths = sorted(str(p.resolve()) for p in root.rglob("*")
                       if p.is_file() and not _hidden(str(p.relative_to(root))))  # fmt: skip
    else:
        near = sorted(p.name for p in root.parent.glob(f"{glob.escape(root.name)}*"))
        raise InputError(f"files = {where!r}: no such folder or file{_glob_hint(where, near)}")
    if not paths:
        raise InputError(f"files = {where!r}: no files there")
    return [(p, file_version(p)) for p in paths]


def _in_object_store(where: str) -> list[tuple[str, str]]:
    if has_magic(where):
        folder, segments = split(where)
        if not folder.partition("://")[2]:
            raise ConfigError(
                f"files = {where!r}: the bucket of an s3:// glob is named as it is; the "
                "wildcards go in the keys (s3://bucket/texts/*.txt)"
            )
        store = open_store(folder)
        # Listed from the text before the first wildcard only (f0 for f0*.txt): a
        # folder of a million objects is not listed for the few that can match
        start = fixed_start(segments)
        found = [(f"{store.url}/{key}", version)
                 for key, version in store.listed_versions(start)
                 if matches(segments, key.split("/"))]  # fmt: skip
        if not found:
            raise InputError(
                f"files = {where!r}: no files match this glob (of the objects under "
                f"{store.url}/{start})"
            )
        return found
    store = open_store(where)
    found = [(f"{store.url}/{key}", version)
             for key, version in store.listed_versions() if not _hidden(key)]  # fmt: skip
    if found:
        return found
    parent, _, name = store.url.rpartition("/")
    if parent.endswith(":/"):  # the bucket itself
        raise InputError(f"files = {where!r}: no files there (the bucket holds no objects)")
    # Not a folder: an object of that name, or a name other objects begin with
    beside = open_store(parent).listed_versions(name, limit=3)
    if beside and beside[0][0] == name:
        return [(store.url, beside[0][1])]
    near = [key for key, _ in beside if not key.startswith(f"{name}/")]
    raise InputError(
        f"files = {where!r}: no files there (an s3:// prefix is taken as a folder, and "
        f"no object is under {store.url}/, nor named {store.url})" + _glob_hint(where, near)
    )


def _glob_hint(where: str, near: list[str]) -> str:
    """Files whose names begin with the name given: the glob that takes them."""
    if not near:
        return ""
    return (
        f"; for the files whose names begin with {where.rstrip('/').rsplit('/', 1)[-1]!r} "
        f"({near[0]}{', ...' if len(near) > 1 else ''}), give a glob: {where.rstrip('/')}*"
    )


def _hidden(relative: str) -> bool:
    return any(hidden(part) for part in relative.split("/"))
