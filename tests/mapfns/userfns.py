"""Functions a user might map. Files they use (a call log, a failure flag) come as
arguments: the embedded cluster's workers do not see the tests' environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def _log(log: str | None, what: str) -> None:
    if log:
        with open(log, "a") as f:
            f.write(what + "\n")


def power(x, p=2, seed=None, log=None, flag=None):
    _log(log, f"power {x} {p}")
    if flag and Path(flag).exists() and x == 3:
        raise ValueError(f"x = {x} is refused while the flag is set")
    rng = np.random.default_rng(seed)
    return {"value": x**p, "noise": float(rng.random())}


def flaky(x, markers):
    """Fails on its first call for each x (a marker file per x), then succeeds."""
    marker = Path(markers) / f"{x}"
    if not marker.exists():
        marker.write_text("failed once")
        raise ConnectionError(f"transient failure for {x}")
    return {"ok": True}


def file_size(path):
    return {"bytes": os.path.getsize(path), "name": Path(path).name}


def file_bytes(path):
    return {"bytes": os.path.getsize(path)}


def chunk_stats(chunk: pd.DataFrame):
    return pd.DataFrame({"n": [len(chunk)], "y_mean": [float(chunk["y"].mean())]})


def rows_per_unit(x):
    """x rows for x, None for 0."""
    if x == 0:
        return None
    return pd.DataFrame({"i": np.arange(x), "half": np.arange(x) / 2})


def group_means(chunk: pd.DataFrame):
    """A groupby's frame: the group is the index."""
    return chunk.groupby("h")[["y"]].mean()


def big_rows(chunk: pd.DataFrame):
    """A filtered chunk: its index is row labels."""
    return chunk[chunk["y"] >= 6][["y"]]


def summary_series(chunk: pd.DataFrame):
    return chunk[["y"]].agg(["min", "max"]).iloc[:, 0]


def rows_as_dicts(chunk: pd.DataFrame):
    return [{"i": i, "y": float(y)} for i, y in enumerate(chunk["y"])]


def echoes_its_parameters(x, p):
    """The parameters returned as they came, next to the result."""
    return {"x": x, "p": p, "y": x**p}


def group_means_by_key(chunk: pd.DataFrame):
    """A groupby on the chunk key and another column: the key is in the index."""
    return chunk.groupby(["g", "h"])[["y"]].mean()


def several_statistics(chunk: pd.DataFrame):
    """agg with a list of functions: columns of two levels, ("y", "mean")."""
    return chunk.groupby("h").agg({"y": ["mean", "max"]})


def changes_its_key(x):
    return {"x": x + 1}


def changes_its_key_in_numpy(x):
    return {"x": np.float64(x) + 1}


def rows_generated(x):
    for i in range(x):
        yield {"i": i}


def values_generated(x):
    yield from range(x)


def rows_and_values(x):
    return [{"i": x}, x]


def wrong_type(x):
    return {x}  # a set: neither a value nor rows


def one_value(x):
    """A value per unit, of the type ``x`` says."""
    import datetime

    import numpy as np

    return {"int": 7, "float": np.float64(0.5), "text": "abc",
            "day": datetime.date(2024, 1, 2), "array": np.array([1.5, 2.5]),
            "matrix": np.eye(2), "pair": (0.25, 3)}[x]  # fmt: skip


def arrays_in_a_row(x):
    """A row of numpy arrays of 2, 0 and 1 dimensions, as a returned array is taken."""
    import numpy as np

    return {"matrix": np.eye(2) * x, "mean": np.array(x * 1.5), "vector": np.arange(2.0)}


def mixed_types(x):
    return {"v": x if x % 2 else f"text {x}"}


def keyword_only(*, alpha):
    return {"alpha": alpha}


not_callable = 42


def unstorable(x):
    """Unit 1's row holds an integer wider than 64 bits, unit 2's an arbitrary object."""
    value = {1: 2**70, 2: object()}.get(x, x)
    return {"v": value if x != 2 else 0, "w": value if x == 2 else 0.5}


def column_types(chunk: pd.DataFrame):
    return {f"{name}_type": str(dtype) for name, dtype in chunk.dtypes.items()}


def ends_its_process(x):
    """Unit 3 ends the worker process, as a crash in compiled code would; unit 6
    raises SystemExit, a failure of its own."""
    if x == 3:
        os._exit(3)
    if x == 6:
        sys.exit(6)
    return {"y": x}


def line_count(path):
    """Through ``pipeline.open_file``: a local path or an s3:// URL alike."""
    import pipeline

    with pipeline.open_file(path, "r") as f:
        return {"lines": sum(1 for _ in f)}


def quantiles(x):
    """Labels that are not text, as ``series.quantile([...]).to_dict()`` gives."""
    return {0.5: x, 0.9: 2 * x}


def waits(x, i=0, seconds=0.05):
    """A unit that waits (a network call's stand-in) or computes for ``seconds``."""
    import time

    if x == "wait":
        time.sleep(seconds)
    else:
        start = time.process_time()
        while time.process_time() - start < seconds:
            pass
    return {"x": x}


def list_param(dims):
    """A grid whose values are lists, returning a mapping value."""
    return {"n": len(dims), "first": {"k": dims[0]}}


class Scale:
    """A grid value that is an object (an estimator, say), with a repr of its settings."""

    def __init__(self, k):
        self.k = k

    def __repr__(self) -> str:
        return f"Scale(k={self.k})"


class Bare:
    """A grid value without a repr of its own."""

    def __init__(self, k):
        self.k = k


def scaled(model, x):
    return {"y": model.k * x}


def weekday(day, k=1):
    return {"weekday": day.weekday(), "k": k}


def exits_or_interrupts(x):
    """Code that ends itself: recorded as the unit's failure, not the driver's end."""
    if x == 2:
        sys.exit(3)
    if x == 3:
        raise KeyboardInterrupt
    return {"y": x}


def nested_map(x):
    """A map inside a map: it would start a cluster inside the worker."""
    import tempfile

    import pipeline

    return pipeline.map(double, grid={"x": [x]}, output=tempfile.mkdtemp()).units_run


def double(x):
    return {"y": 2 * x}


def nothing(x):
    """Returns no rows."""
    return None


def kind_of(x, p):
    return {"kind": type(x).__name__}


def odd_fails(x):
    if x % 2:
        raise ValueError(f"x = {x} is odd")
    return {"y": x}


def as_bytes(x):
    return {"blob": b"\x00\xff" * x}


def rows_in(chunk: pd.DataFrame):
    return {"rows": len(chunk)}


def reprs(**params):
    """What the call got, as text: each parameter's repr."""
    return {f"{k}_repr": repr(v) for k, v in params.items()}
