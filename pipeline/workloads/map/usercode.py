"""Users' own code: finding their function, checking it can take its input, shipping
it to workers, seeding it, and saying where in it a unit failed.

A function is named ``"module:callable"`` (``"module:Class.method"`` works too). On
the embedded cluster the job file's folder and the current directory are on the
workers' import path as on the driver's (spawned workers inherit ``sys.path``).
A remote cluster gets ``code = PATH`` (a ``.py`` file, a package or a folder of
modules) through a worker plug-in (:mod:`.shipped_code`), which also reaches
workers that join later.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...cluster.shipped_code import shipped_files
from ...errors import ConfigError

__all__ = [
    "code_hash",
    "failure_frame",
    "load_function",
    "unit_seed",
]


def load_function(spec: str, setting: str = "function") -> Callable:
    """Import ``"module:callable"``; a clear error naming what failed."""
    module_name, sep, qualname = (spec or "").partition(":")
    if not sep or not module_name or not qualname:
        raise ConfigError(f"{setting} = {spec!r}: expected 'module:callable' (e.g. 'fits:fit_one')")
    try:
        module = importlib.import_module(module_name)
    except SystemExit:
        # A script whose top level runs and exits (sys.exit(main())): imported here it
        # would end the driver, silently and with that exit status
        raise ConfigError(
            f"{setting} = {spec!r}: module {module_name!r} exits when imported (sys.exit "
            'at its top level); put its script code under `if __name__ == "__main__":`'
        ) from None
    except Exception as exc:
        raise ConfigError(
            f"{setting} = {spec!r}: module {module_name!r} does not import: "
            f"{type(exc).__name__}: {exc} (it is looked for in the job file's folder, the "
            "current directory and the installed packages; see also code = PATH)"
        ) from None
    target: Any = module
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(
                f"{setting} = {spec!r}: module {module_name!r} has no {qualname!r}"
            ) from None
    if not callable(target):
        raise ConfigError(
            f"{setting} = {spec!r}: {qualname!r} is a {type(target).__name__}, not callable"
        )
    return target


def describe_function(fn: Callable) -> str:
    """``module:qualname``; a callable object is named by its class."""
    name = getattr(fn, "__qualname__", None) or f"{type(fn).__qualname__} object"
    return f"{getattr(fn, '__module__', None) or type(fn).__module__}:{name}"


def check_signature(
    fn: Callable, *, positional: int = 0, keywords: tuple[str, ...] = (), what: str = ""
) -> None:
    """Raise ``ConfigError`` unless ``fn`` takes ``positional`` positional arguments
    and these keyword arguments."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function without a signature: let the call decide
    params = list(sig.parameters.values())
    name = describe_function(fn)
    if positional:
        takes = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(takes) < positional and not any(p.kind == p.VAR_POSITIONAL for p in params):
            raise ConfigError(
                f"function {name}{sig} cannot take {what}: it needs a positional parameter "
                f"for it (e.g. def {getattr(fn, '__name__', 'f')}(chunk): ...)"
            )
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        refused = [k for k in keywords if k not in accepted]
        if refused:
            raise ConfigError(
                f"function {name}{sig} does not accept the grid key(s) "
                f"{', '.join(map(repr, refused))}; its parameters: {', '.join(sorted(accepted))}"
            )
    required = [
        p.name
        for p in params[positional:]
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in keywords
        and p.name != "seed"
    ]
    if required:
        raise ConfigError(
            f"function {name}{sig}: parameter(s) {', '.join(map(repr, required))} would get "
            f"no value ({what})"
        )


def accepts_seed(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "seed" in params and params["seed"].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def unit_seed(seed: int, unit: int) -> int:
    """The seed of unit ``unit`` of a job with ``seed``: the same on any worker, in
    any task, on any retry; independent streams for different units
    (``numpy.random.SeedSequence([seed, unit])``)."""
    # 63 bits: a non-negative int64, storable in a parquet column.
    return int(np.random.SeedSequence([seed, unit]).generate_state(1, np.uint64)[0] >> 1)


def failure_frame(exc: BaseException) -> str | None:
    """``file:line in function: source`` of the innermost traceback frame in the
    user's code (not this package, not the standard library or installed packages)."""
    skip = tuple(
        str(Path(p).resolve())
        for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, Path(__file__).parent}
    )
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if not frame.filename or not os.path.isabs(frame.filename):
            continue  # compiled extensions' frames (pyarrow/error.pxi), <frozen ...>
        if not str(Path(frame.filename).resolve()).startswith(skip):
            found = frame
    if found is None:
        return None
    line = f": {found.line}" if found.line else ""
    return f"{found.filename}:{found.lineno} in {found.name}{line}"


def code_hash(path: str | os.PathLike) -> str:
    """A hash of a ``.py`` file or a folder's ``.py`` files (names and bytes): those
    shipped, not in hidden folders or caches (``code = "."`` beside a ``.venv`` read its
    ten thousand modules, and a package installed there made the job's code another)."""
    p = Path(path)
    digest = hashlib.sha256()
    for f in (f for f in shipped_files(p) if f.suffix == ".py" or f == p):
        digest.update(str(f.relative_to(p.parent)).encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def check_code_path(path: str) -> Path:
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".py":
        return p.resolve()
    if p.is_dir() and any(p.rglob("*.py")):
        return p.resolve()
    if not p.exists():  # (told "expected a .py file" of a .py file's name)
        raise ConfigError(
            f"code = {path!r}: no such file or folder ({p.absolute()}: a job file's paths "
            "are taken from the folder the command runs in)"
        )
    raise ConfigError(f"code = {path!r}: expected a .py file or a folder of Python code")
