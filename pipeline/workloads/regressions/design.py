"""A task's design matrices: built once per task from the formula wherever that gives
the matrices statsmodels would build chunk by chunk, else per chunk.

:class:`Prepared` is one chunk's model arrays, ready for :mod:`.fit`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .missing import chunks_with_missing_text, isnull, missing_by_column, without_missing_text
from .patsy_fast import coded_columns, design_once, keep_all_na
from .spec import ModelSpec

__all__ = ["ChunkError", "Prepared", "TaskDesign", "patsy_frame"]


class ChunkError(Exception):
    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type
        self.message = message


@dataclass
class Prepared:
    """A chunk's model arrays, NaN rows already dropped."""

    y: np.ndarray
    X: np.ndarray
    names: tuple[str, ...]
    weights: np.ndarray | None = None
    groups: np.ndarray | None = None
    dropped: int = 0
    finite: bool = False  # known to hold no NaN/inf (checks may skip scanning for them)
    #: Where the dropped rows' missing values are ("40 in y"): asked only of a chunk
    #: that fails, since it reads the chunk's columns again.
    where_missing: Callable[[], str] | None = None

    def dropped_note(self) -> str:
        """ " (40 rows dropped for missing values: 40 in y)", or "" if none were."""
        if not self.dropped:
            return ""
        where = self.where_missing() if self.where_missing is not None else ""
        rows = "row" if self.dropped == 1 else "rows"
        return f" ({self.dropped} {rows} dropped for missing values{': ' if where else ''}{where})"


class _RecordingNA:
    """patsy's ``drop`` NA action that also remembers which rows it dropped (as
    statsmodels' formula manager does, to drop the same rows of weights and groups)."""

    def __new__(cls, **kw):
        import patsy.missing

        class Recording(patsy.missing.NAAction):
            missing_mask = None

            def _handle_NA_drop(self, values, is_nas, origins):
                mask = np.zeros(is_nas[0].shape[0], dtype=bool)
                for is_na in is_nas:
                    mask |= is_na
                self.missing_mask = mask
                return [v[~mask, ...] if v.ndim > 1 else v[~mask] for v in values]

        return Recording(**kw)


class TaskDesign:
    """The design matrices of a task's chunks, built once per task where that gives the
    same matrices as building them per chunk (see the package docs), else per chunk."""

    def __init__(self, spec: ModelSpec, table, offsets: np.ndarray, info=None):
        self.spec = spec
        self._read = (table, offsets)  # as read: where a failed chunk's missing values are
        # A null in a column that is not a number (text, a boolean...) is a missing
        # value, as in statsmodels, where the task's design, told that no value is
        # missing, took it for a level of its own ("b[T.None]"). With missing = "drop"
        # its rows leave the task's table here (so that its chunks keep the design
        # built once: each designed alone by patsy was 140 times slower); with "fail"
        # its chunks fail.
        self.missing_text: dict[int, str] = {}
        self.text_dropped: np.ndarray | None = None  # rows dropped so, per chunk
        if spec.formula is not None and spec.missing == "fail":
            self.missing_text = chunks_with_missing_text(table, offsets)
        elif spec.formula is not None:
            table, offsets, self.text_dropped = without_missing_text(table, offsets)
        self.offsets = offsets
        self.n = len(offsets) - 1
        self.weights = self._float(table, spec.weights)
        self.groups = (
            np.asarray(table.column(spec.cluster).to_numpy(zero_copy_only=False))
            if spec.cluster
            else None
        )
        self.exact = False
        if spec.formula is None:
            self._arrays(table)
        else:
            self.table = table
            self.exact = info.exact_only if info is not None else False
            self.subsets = not (info is not None and info.explicit_contrasts)
            if not self.exact:
                try:
                    with quiet_math():
                        self._formula_once()
                except Exception:
                    self.exact = True  # e.g. missing categories: per chunk, as statsmodels would

    @functools.cached_property
    def df(self):
        """The task's rows as pandas, for designs built per chunk (only those need it);
        columns read as dictionaries are strings again, as a chunk alone would have them."""
        import pyarrow as pa

        table = self.table
        for j, field in enumerate(table.schema):
            if pa.types.is_dictionary(field.type):
                table = table.set_column(j, field.name, table.column(j).cast(field.type.value_type))
        return patsy_frame(table)

    @staticmethod
    def _float(table, name):
        if not name:
            return None
        col = table.column(name).to_numpy(zero_copy_only=False)
        return np.asarray(col, dtype=np.float64)

    def _arrays(self, table) -> None:
        spec = self.spec
        cols = [self._float(table, c) for c in spec.exog]
        n = table.num_rows
        if spec.add_constant:
            cols.insert(0, np.ones(n))
        self.Xg = np.column_stack(cols) if cols else np.empty((n, 0))
        self.yg = self._float(table, spec.endog)
        self.names = (("const",) if spec.add_constant else ()) + spec.exog
        self.factor_codes = []

    def _formula_once(self) -> None:
        import patsy

        from .spec import model_desc

        desc = model_desc(self.spec.formula)
        y, X, info, values = design_once(desc, coded_columns(self.table))
        if y.shape[1] != 1:
            raise ValueError("categorical response")
        self.yg = np.ascontiguousarray(y[:, 0])
        self.Xg = X
        self.names = tuple(info.column_names)
        self.rhs = patsy.ModelDesc([], desc.rhs_termlist)
        # Per categorical factor, each row's level; a chunk missing some levels gets the
        # columns a design built on that chunk alone would have (cached per level set).
        self.factor_codes = []
        self.signature = np.zeros((self.n, 0), dtype=bool)
        for factor, fi in info.factor_infos.items():
            if fi.type != "categorical":
                continue
            codes = values[factor]
            present = levels_present(codes, self.offsets, len(fi.categories))
            self.signature = np.hstack([self.signature, present])
            self.factor_codes.append(codes)
        self.full = self.signature.all(axis=1)
        self._columns: dict[bytes, np.ndarray | None] = {}

    def _chunk_columns(self, i: int, s: int, e: int) -> np.ndarray | None:
        """Columns of a chunk whose level set differs: those a chunk-alone design has."""
        import patsy

        from .spec import eval_env

        sig = self.signature[i].tobytes()
        if sig not in self._columns:
            try:
                with quiet_math():
                    names = patsy.dmatrix(
                        self.rhs, self.df.iloc[s:e], eval_env=eval_env(), NA_action=keep_all_na()
                    ).design_info.column_names
            except Exception:  # designed alone, the chunk says what is wrong with it
                return None
            where = {n: j for j, n in enumerate(self.names)}
            self._columns[sig] = (
                np.array([where[n] for n in names], dtype=np.intp)
                if all(n in where for n in names)
                else None
            )
        return self._columns[sig]

    def plain_chunks(self) -> np.ndarray:
        """Chunks whose rows of the task's design are their design as they are: the design
        is built once per task and the chunk has every categorical level (so a design
        built on it alone has the same columns). Rows with missing values are not looked
        for here."""
        if self.exact:
            return np.zeros(self.n, dtype=bool)
        ok = np.diff(self.offsets) > 0
        if self.factor_codes:
            ok &= self.full
        if self.missing_text:
            ok[list(self.missing_text)] = False
        if self.text_dropped is not None:
            ok &= self.text_dropped == 0  # (prepared one by one: their rows dropped said)
        return ok

    def stack(self, chunks: np.ndarray, rows: int):
        """X (B, rows, k), y (B, rows) and the weights (B, rows) or None of ``chunks``
        (each of ``rows`` rows): views of the task's arrays when the chunks are
        consecutive, else gathered once."""
        k = self.Xg.shape[1]
        starts = self.offsets[chunks]
        B = len(chunks)
        w = self.weights
        if B and (B == 1 or np.all(np.diff(starts) == rows)):
            a, e = int(starts[0]), int(starts[0]) + B * rows
            return (self.Xg[a:e].reshape(B, rows, k), self.yg[a:e].reshape(B, rows),
                    None if w is None else w[a:e].reshape(B, rows))  # fmt: skip
        at = (starts[:, None] + np.arange(rows)).ravel()
        return (self.Xg[at].reshape(B, rows, k), self.yg[at].reshape(B, rows),
                None if w is None else w[at].reshape(B, rows))  # fmt: skip

    def prepare(self, i: int) -> Prepared:
        """Chunk ``i``'s arrays; raises :class:`ChunkError` if they cannot be built."""
        p = self._prepare(i)
        if p.dropped:
            p.where_missing = functools.partial(self._where_missing, i)
        return p

    def _where_missing(self, i: int) -> str:
        table, offsets = self._read
        return missing_by_column(table, int(offsets[i]), int(offsets[i + 1]))

    def _prepare(self, i: int) -> Prepared:
        s, e = int(self.offsets[i]), int(self.offsets[i + 1])
        if i in self.missing_text:
            raise ChunkError(
                "MissingValues", f"missing values (missing = fail): {self.missing_text[i]}"
            )
        dropped = int(self.text_dropped[i]) if self.text_dropped is not None else 0
        if s == e:  # every row had a null text value: no design to build, nothing to fit
            return Prepared(np.empty(0), np.empty((0, 0)), (), dropped=dropped, finite=True)
        if self.exact:
            return self._prepare_exact(s, e, dropped)
        names, X = self.names, self.Xg[s:e]
        if self.factor_codes and not self.full[i]:
            # Treatment coding: a chunk alone has a subset of the task's columns, the
            # same values. Another coding of fewer levels has other values.
            cols = self._chunk_columns(i, s, e) if self.subsets else None
            if cols is None:
                return self._prepare_exact(s, e, dropped)
            # Row-major, like the task's matrix: BLAS and LAPACK round differently on a
            # column-major copy, and a chunk's bits must not depend on its neighbours
            # (whether its task, or slice, has levels it lacks).
            names, X = tuple(self.names[j] for j in cols), np.ascontiguousarray(X[:, cols])
        y = self.yg[s:e]
        w = self.weights[s:e] if self.weights is not None else None
        g = self.groups[s:e] if self.groups is not None else None
        if not self._nonfinite_chunks[i]:
            return Prepared(y, X, names, w, g, dropped=dropped, finite=True)
        return self._drop_missing(y, X, names, w, g, dropped)

    @functools.cached_property
    def _nonfinite_chunks(self) -> np.ndarray:
        """Per chunk: whether a row holds a NaN or inf (or a null group): found once
        for the task rather than scanned for in each chunk."""
        bad = ~np.isfinite(self.yg) | ~np.isfinite(self.Xg).all(axis=1)
        if self.weights is not None:
            bad |= ~np.isfinite(self.weights)
        if self.groups is not None:
            bad |= isnull(self.groups)
        out = np.zeros(self.n, dtype=bool)
        out[np.searchsorted(self.offsets, np.flatnonzero(bad), side="right") - 1] = True
        return out

    def _drop_missing(self, y, X, names, w, g, dropped: int = 0) -> Prepared:
        if self.spec.missing == "drop":
            bad = np.isnan(y) | np.isnan(X).any(axis=1)
            if w is not None:
                bad |= np.isnan(w)
            if g is not None:
                bad |= isnull(g)
            if bad.any():
                keep = ~bad
                y, X = y[keep], X[keep]
                w = w[keep] if w is not None else None
                g = g[keep] if g is not None else None
                dropped += int(bad.sum())
        return Prepared(y, X, names, w, g, dropped)

    def _prepare_exact(self, s: int, e: int, dropped: int = 0) -> Prepared:
        import patsy

        from .spec import eval_env, model_desc

        chunk = self.df.iloc[s:e]
        na = _RecordingNA() if self.spec.missing == "drop" else keep_all_na()
        try:
            with quiet_math():
                y, X = patsy.dmatrices(
                    model_desc(self.spec.formula),
                    chunk,
                    eval_env=eval_env(),
                    NA_action=na,
                    return_type="matrix",
                )
        except Exception as exc:
            raise ChunkError("DesignError", f"cannot build the design: {exc}") from None
        mask = getattr(na, "missing_mask", None)
        keep = ~mask if mask is not None else slice(None)
        w = self.weights[s:e][keep] if self.weights is not None else None
        g = self.groups[s:e][keep] if self.groups is not None else None
        dropped += int(mask.sum()) if mask is not None else 0
        return self._drop_missing(
            np.asarray(y, dtype=float)[:, 0],
            np.asarray(X, dtype=float),
            tuple(X.design_info.column_names),
            w,
            g,
            dropped,
        )


#: Cells of a task's table designed and fitted at a time. Measured on tasks of 5,000
#: chunks of 250 rows x 7 columns (one process, the workers' heap settings; median of
#: 6): designed whole, 0.107-0.120 ms a chunk (0.077 at best), its arrays of 60-90 MB
#: mapped afresh by each task; in slices of 2**21 cells, 0.083 (tasks of 1,000 chunks,
#: one slice: 0.077); 2**19, 0.089 (each slice learns its design again). A slice's
#: design matrix stays under the workers' mmap threshold (32 MB) unless categoricals
#: widen the table many times over.
SLICE_CELLS = 1 << 21


def quiet_math():
    """numpy's floating-point warnings off while a formula is evaluated: the values it
    makes non-finite (np.log(0)) are each chunk's failure, reported as such
    (NonFiniteValues); the warnings, from driver and workers, named pandas' internals."""
    return np.errstate(divide="ignore", invalid="ignore", over="ignore")


def levels_present(codes: np.ndarray, offsets: np.ndarray, n_levels: int) -> np.ndarray:
    """(chunks, levels) booleans: whether chunk i (rows ``offsets[i]:offsets[i+1]``) has
    a row of each level. Few levels: a pass per level, 0.14 ms for 2,500 chunks of 250
    rows and 4 levels, where a count of (chunk, level) pairs took 1.2 ms."""
    n = len(offsets) - 1
    if n_levels > 16:
        chunk_of_row = np.repeat(np.arange(n), np.diff(offsets))
        pairs = np.bincount(chunk_of_row * n_levels + codes, minlength=n * n_levels)
        return pairs.reshape(n, n_levels) > 0
    present = np.zeros((n, n_levels), dtype=bool)
    rows = np.diff(offsets) > 0  # reduceat takes an empty chunk's next row: skip those
    starts = offsets[:-1][rows]
    if not starts.size:
        return present
    for level in range(n_levels):
        present[rows, level] = np.logical_or.reduceat(codes == level, starts)
    return present


def design_slices(offsets: np.ndarray, columns: int) -> list[tuple[int, int]]:
    """Ranges ``(a, b)`` of a task's chunks (chunk i holds rows ``offsets[i]:offsets[i+1]``
    of a table of ``columns`` columns), in order, each of at most :data:`SLICE_CELLS`
    cells or one chunk."""
    rows = max(1, SLICE_CELLS // max(1, columns))
    n, out, a = len(offsets) - 1, [], 0
    while a < n:
        b = int(np.searchsorted(offsets, offsets[a] + rows, side="right")) - 1
        b = min(n, max(b, a + 1))
        out.append((a, b))
        a = b
    return out


def patsy_frame(table):
    """``table`` as the pandas frame a formula is evaluated on: numpy types and objects,
    not pandas' nullable types that the files' pandas metadata asks for (patsy fails
    on a nullable boolean: "Cannot interpret 'BooleanDtype' as a data type"); a null
    is then None, or NaN in a number column, which patsy takes as missing."""
    return table.to_pandas(ignore_metadata=True, use_threads=False)
