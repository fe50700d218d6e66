"""patsy's design matrices of a task's rows, built the way patsy builds them (same
levels, contrasts, column names and bits) but with the per-row and per-column
Python work taken out: strings coded as categoricals at once, the matrix filled a
block of rows at a time. :class:`.design.TaskDesign` uses them.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["coded_columns", "design_once", "keep_all_na"]


def keep_all_na():
    """No value is NA: patsy keeps every row. (``on_NA="raise"`` then returns the values
    as they are, where the default ``"drop"`` copies every factor's values.)"""
    import patsy.missing

    return patsy.missing.NAAction(on_NA="raise", NA_types=[])


def design_once(desc, data):
    """patsy's design matrices of ``desc`` on ``data``: y and X, X's design info and
    each factor's values (codes for categoricals).

    patsy fills its row-major matrix a column at a time, a strided pass over the whole
    matrix per column (the most expensive step of a task's design); this fills it a
    block of rows at a time, with the same products in the same order, so the values
    are patsy's bit for bit. patsy still learns the design (levels, contrasts, column
    names) and evaluates the factors; what it learned is kept for the next rows of
    the same formula and column types (``_LEARNED``)."""
    na = keep_all_na()
    key = _data_key(desc, data)
    learned = _LEARNED.get(key)
    if learned is not None:
        try:
            values = _factor_values(learned, data, na)
        except Exception:
            values = None  # a value outside the levels learned: learn these rows'
        if values is not None and _all_levels_used(learned[1], values):
            return _matrices(learned, values)
    learned = _learn(desc, data, na)
    if _reusable(learned):
        if len(_LEARNED) >= _LEARNED_KEPT:
            del _LEARNED[next(iter(_LEARNED))]  # the oldest
        _LEARNED[key] = learned
    return _matrices(learned, _factor_values(learned, data, na))


#: What patsy learned of a formula on rows (y's and X's design infos), by formula and
#: the columns' types: a task designs its rows a slice at a time, each slice of the
#: same columns, and learning the design (evaluating every factor to sniff its type
#: and levels) cost 1.9 ms a slice, a tenth of the design (2,500 chunks of 250 rows).
_LEARNED: dict[tuple, tuple] = {}
_LEARNED_KEPT = 8


def _learn(desc, data, na) -> tuple:
    import patsy

    return tuple(
        patsy.design_matrix_builders(
            [desc.lhs_termlist, desc.rhs_termlist], lambda: iter([data]), _fast_env(), na
        )
    )


def _data_key(desc, data) -> tuple:
    """The formula and each column's type, with a categorical's categories (the sorted
    values its rows use): the levels patsy learns from those columns."""
    import pandas as pd

    columns = []
    for name, value in data.items():
        dtype = getattr(value, "dtype", None)
        categories = tuple(value.categories) if isinstance(dtype, pd.CategoricalDtype) else None
        columns.append((name, str(dtype), categories))
    return desc.describe(), tuple(columns)


def _reusable(learned: tuple) -> bool:
    """No stateful transform (``center(x)``), whose state is learned from the rows'
    values. (Formulas with one are designed chunk by chunk, never here: a guard.)"""
    return not any(
        fi.state.get("transforms") for info in learned for fi in info.factor_infos.values()
    )


def _all_levels_used(x_info, values: dict) -> bool:
    """Whether these rows use every level learned for each categorical factor, as rows
    patsy learned from would (levels it sniffs from values are those the rows hold)."""
    for factor, fi in x_info.factor_infos.items():
        if fi.type == "categorical":
            used = np.bincount(values[factor], minlength=len(fi.categories))
            if len(used) != len(fi.categories) or not used.all():
                return False
    return True


def _factor_values(learned: tuple, data, na) -> dict:
    values = {}
    for info in learned:
        for factor, fi in info.factor_infos.items():
            if factor not in values:
                value, is_na = _eval_factor(fi, data, na)
                if fi.type == "categorical" and np.any(is_na):
                    raise ValueError(f"{factor.name()}: missing values")
                values[factor] = np.asarray(value)
    return values


def _matrices(learned: tuple, values: dict):
    y_info, x_info = learned
    rows = len(next(iter(values.values())))  # the response is a factor: never empty
    return _columns(y_info, values, rows), _columns(x_info, values, rows), x_info, values


def _eval_factor(fi, data, na):
    """patsy's ``_eval_factor``, but a categorical factor with its own contrast or levels
    (``C(g, Sum)``), which evaluates to patsy's box around the column's pandas
    categorical, has its codes taken whole when its categories are the factor's levels
    (patsy codes a boxed column a row at a time)."""
    import pandas as pd
    from patsy.build import _eval_factor as patsy_eval_factor
    from patsy.categorical import _CategoricalBox, categorical_to_int

    if fi.type != "categorical":
        # A bare column name: patsy's evaluation (the name looked up, the series framed
        # and unframed) cost 0.2 ms a factor and slice for the same array.
        code = getattr(fi.factor, "code", None)
        column = data.get(code) if code is not None and fi.num_columns == 1 else None
        if isinstance(column, pd.Series) and column.dtype.kind in "fiu":
            return column.to_numpy().reshape(-1, 1), None
        return patsy_eval_factor(fi, data, na)
    value = fi.factor.eval(fi.state, data)
    inner = value.data if isinstance(value, _CategoricalBox) else None
    if (
        isinstance(getattr(inner, "dtype", None), pd.CategoricalDtype)
        and tuple(inner.categories) == tuple(fi.categories)
        and (value.levels is None or tuple(value.levels) == tuple(fi.categories))
    ):
        codes = np.asarray(inner.codes)
    else:
        codes = categorical_to_int(value, fi.categories, na, origin=fi.factor)
    return codes, np.asarray(codes == -1)


def _columns(info, values: dict, rows: int) -> np.ndarray:
    """What patsy's ``_build_subterm`` computes, into a row-major (rows, columns) matrix
    a block of rows at a time, so that the column-by-column passes stay in cache."""
    from patsy.build import _subterm_column_combinations

    plan = []  # per column: [(values, contrast matrix or None, column index)]
    for subterms in info.term_codings.values():
        for subterm in subterms:
            for idxs in _subterm_column_combinations(info.factor_infos, subterm):
                plan.append(
                    [
                        (values[f], subterm.contrast_matrices[f].matrix, i)
                        if info.factor_infos[f].type == "categorical"
                        else (values[f], None, i)
                        for f, i in zip(subterm.factors, idxs, strict=True)
                    ]
                )
    out = np.empty((rows, len(plan)))
    for a in range(0, rows, _FILL_ROWS):
        b = min(rows, a + _FILL_ROWS)
        block = out[a:b]
        for j, factors in enumerate(plan):
            column = block[:, j]
            if not factors:  # the intercept
                column[...] = 1
            for f, (v, contrast, i) in enumerate(factors):
                value = v[a:b, i] if contrast is None else contrast[v[a:b], i]
                if f == 0:
                    column[...] = value  # patsy: 1 * value, the same bits
                else:
                    column *= value
    return out


_FILL_ROWS = 16_384  # rows filled at a time (measured: 4096 pays Python overhead)


def coded_columns(table) -> dict:
    """The task's columns for the design built once: numbers as pandas Series of the
    arrays (not a frame, which would copy them: patsy reads a dict of columns), strings
    as pandas categoricals whose categories are the sorted distinct values, so that patsy
    codes them as it codes the strings (levels sorted, as UTF-8 bytes sort like code
    points) but vectorized instead of one Python call per row. Columns with nulls and
    other types go through pandas, as in a frame (patsy's own NA handling decides)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    out = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        t = col.type
        if col.null_count == 0 and (pa.types.is_floating(t) or pa.types.is_integer(t)):
            # a Series, as in a frame: patsy names the levels of C(int_column) after
            # Python scalars then ("C(g)[T.1]", not "C(g)[T.np.int64(1)]")
            out[name] = pd.Series(col.to_numpy(), copy=False)
        elif col.null_count == 0 and (pa.types.is_string(t) or pa.types.is_large_string(t)):
            levels = pc.unique(col)
            levels = levels.take(pc.array_sort_indices(levels))
            codes = pc.index_in(col, value_set=levels).to_numpy()
            out[name] = pd.Categorical.from_codes(codes, levels.to_pylist())
        elif col.null_count == 0 and pa.types.is_dictionary(t) and _is_text(t.value_type):
            out[name] = _dictionary_categorical(col)
        else:
            out[name] = col.to_pandas(use_threads=False)
    return out


def _is_text(t) -> bool:
    import pyarrow as pa

    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _dictionary_categorical(col):
    """A dictionary-encoded string column as a pandas categorical of the values its rows
    use, sorted (a row group's dictionary may hold values of rows read and dropped)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    if col.num_chunks > 1:
        # One dictionary for all: a task of hundreds of small files has as many
        # chunks, and the steps below cost ~60 us a chunk (1 ms to unify 500).
        col = pa.chunked_array([col.unify_dictionaries().combine_chunks()])
    chunks = [c for c in col.chunks if len(c)]
    used = [  # (a count, not np.unique: no sort of every row's index)
        np.flatnonzero(np.bincount(c.indices.to_numpy(), minlength=len(c.dictionary)))
        for c in chunks
    ]
    levels = pa.concat_arrays(
        [c.dictionary.take(pa.array(u)) for c, u in zip(chunks, used, strict=True)]
        or [pa.array([], pa.string())]
    ).cast(pa.string())
    levels = pc.unique(levels)
    levels = levels.take(pc.array_sort_indices(levels))
    # pandas' own code type for this many levels (int8 up to 127): no conversion there,
    # and a fraction of the bytes for every pass over them after
    codes = np.empty(len(col), dtype=np.min_scalar_type(-len(levels) - 1))
    at = 0
    for c in chunks:
        remap = pc.index_in(c.dictionary.cast(pa.string()), value_set=levels)
        remap = pc.fill_null(remap, -1).to_numpy(zero_copy_only=False).astype(codes.dtype)
        codes[at : at + len(c)] = remap[c.indices.to_numpy()]
        at += len(c)
    # every code is a level's, by construction: pandas' check of each is not needed
    return pd.Categorical.from_codes(codes, dtype=_categories(tuple(levels.to_pylist())),
                                     validate=False)  # fmt: skip


@functools.lru_cache(maxsize=64)
def _categories(levels: tuple):
    """pandas' dtype of these categories, made once: making it (checking the levels)
    cost 0.7 ms, for each slice of each task."""
    import pandas as pd

    return pd.CategoricalDtype(list(levels))


def _fast_env():
    """The formula namespace, with a ``C`` that passes a pandas categorical through
    unboxed when it has no contrast or levels: patsy codes an unboxed categorical
    vectorized, a boxed one row by row (same levels, same columns, same names)."""
    import numpy
    import pandas as pd
    import patsy
    from patsy.builtins import C as patsy_C

    def C(data, contrast=None, levels=None):
        if (
            contrast is None
            and levels is None
            and isinstance(getattr(data, "dtype", None), pd.CategoricalDtype)
        ):
            return data
        return patsy_C(data, contrast, levels)

    return patsy.EvalEnvironment([{"np": numpy, "numpy": numpy, "C": C}])
