"""Stores by URL scheme: the built-in ones, and those packages add.

A URL's scheme picks its store's class: a local path (or ``file://``) a
:class:`~.local.LocalStore`, ``s3://`` an :class:`~.s3.S3Store`. A package adds a
scheme of its own by entry point, in the group :data:`GROUP`, named after the scheme
(``gs = "my_package.store:GcsStore"``), as fsspec's registry lets packages add
filesystems. A class is imported when its scheme is first used, and one that cannot
be imported is named with what to install.
"""

from __future__ import annotations

import functools
import importlib
import re
from importlib.metadata import entry_points

from ..errors import ConfigError

__all__ = ["BUILT_IN", "GROUP", "is_remote", "scheme_of", "store_class"]

#: Entry-point group of the stores packages add, each named after its URL scheme.
GROUP = "pipeline.stores"
#: The stores built in: scheme -> (``module:Class``, what to install when it cannot
#: be imported).
BUILT_IN = {
    "file": ("pipeline.storage.local:LocalStore", ""),
    "s3": ("pipeline.storage.s3:S3Store", "boto3 (pip install boto3)"),
}


def scheme_of(url: str) -> str:
    """``s3`` for ``s3://bucket/x``; ``file`` for a local path or a ``file://`` URL."""
    scheme, sep, _ = str(url).partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return "file"
    return scheme.lower()


@functools.cache
def _added() -> dict[str, tuple[str, str]]:
    """The schemes packages add: scheme -> (``module:Class``, the package)."""
    found = {}
    for ep in entry_points(group=GROUP):
        package = ep.dist.name if ep.dist is not None else "an installed package"
        found[ep.name.lower()] = (ep.value, package)
    return found


def known_schemes() -> list[str]:
    return sorted({*BUILT_IN, *_added()})


@functools.cache
def store_class(scheme: str) -> type:
    """The :class:`~.base.Store` subclass for ``scheme``; a :class:`ConfigError` that
    names the scheme and what to install when there is none or it cannot be imported."""
    if scheme in BUILT_IN:
        target, needs = BUILT_IN[scheme]
        where = "built in"
    elif scheme in _added():
        target, package = _added()[scheme]
        needs, where = f"what {package} needs", f"from {package}"
    else:
        others = ", ".join(f"{s}://" for s in known_schemes() if s != "file")
        raise ConfigError(
            f"unsupported scheme {scheme!r}: expected a local path, file:// or {others} "
            f"(a package adds a store for a scheme under the entry-point group {GROUP!r})"
        )
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ConfigError(
            f"the store for {scheme}:// ({target}, {where}) cannot be imported: {exc}; "
            f"install {needs}"
        ) from exc


def is_remote(url: str) -> bool:
    """Whether ``url``'s objects live behind a network (an object store), not on a
    local disk; read from its store's class, without opening it."""
    return bool(store_class(scheme_of(url)).remote)
