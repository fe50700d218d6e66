"""What a user's function's results depend on beyond its arguments and the job's
settings, as a digest the same in every process: its source, the values it captures
(closures, a partial's arguments) and those it reads from its module (constants,
helper functions' source). A ``map`` job records it, and a joblib call's kept results
are keyed by it, so that a resume after a change runs the function again."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import re
from collections.abc import Callable

__all__ = ["has_address", "source_hash"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def has_address(text: str) -> bool:
    """Whether ``text`` (a repr) holds a memory address: another in every process."""
    return _ADDRESS.search(text) is not None


def source_hash(fn: Callable) -> str | None:
    """A hash of what the function's results depend on that the job's settings do not
    say: its source, and the values it captures (closures, a partial's arguments) or
    reads from its module (constants; helper functions' source): a resume with
    ``make(5)`` where ``make(2)`` ran returned the old results."""
    texts = _code_texts(fn)
    return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16] if texts else None


def _code_texts(fn: Callable, helper: bool = False) -> list[str]:
    if isinstance(fn, functools.partial):
        bound = [*fn.args, *sorted(fn.keywords.items())]
        return [*_code_texts(fn.func, helper), *filter(None, map(_stable_text, bound))]
    try:
        texts = [inspect.getsource(fn)]
    except (OSError, TypeError):
        return []
    code = getattr(fn, "__code__", None)
    if code is None or helper:
        return texts  # a helper's own source: not what it reads in turn
    cells = []
    for cell in fn.__closure__ or ():
        with contextlib.suppress(ValueError):  # an empty cell
            cells.append(cell.cell_contents)
    names = getattr(fn, "__globals__", {})
    for value in [*cells, *(names[n] for n in code.co_names if n in names)]:
        if inspect.isfunction(value):
            texts += _code_texts(value, helper=True)
        elif (text := _stable_text(value)) is not None:
            texts.append(text)
    return texts


def _stable_text(value) -> str | None:
    """A plain value's repr, the same in every process (not a set's: its order is not;
    not an object's default repr: its address is not)."""
    if not isinstance(value, int | float | str | bytes | bool | tuple | list | dict | type(None)):
        return None
    text = repr(value)
    return None if has_address(text) else text
