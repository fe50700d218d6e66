"""The regression job's checks before any task runs, each naming the setting, column
or file at fault: how the data is cut into chunks, the columns the model needs and
their types, the formula on the first chunk's rows, and chunks large enough to fit."""

from __future__ import annotations

import pyarrow as pa

from ...errors import ConfigError, InputError
from ...inputs.chunks import ChunkIndex
from ...inputs.dataset import Dataset
from .design import Prepared, quiet_math
from .spec import FormulaInfo, ModelSpec, RegressionJob, analyze_formula
from .taskfits import COEF_COLUMNS, models_schema

__all__ = [
    "check_chunk_sizes",
    "check_chunking",
    "check_formula",
    "check_numeric",
    "needed_columns",
]

#: The tables' own columns (besides the chunk's keys), which no chunk_by column may be.
TABLE_COLUMNS = frozenset(
    ("chunk_id", "row_start", "row_stop", "term", *COEF_COLUMNS,
     *(name for name, _ in models_schema()))
)  # fmt: skip


def check_chunking(job: RegressionJob, by: list[str]) -> None:
    """One way of cutting chunks, and no chunk_by column named like a table's."""
    if by and job.chunk_rows:
        raise ConfigError("give chunk_by or chunk_rows, not both")
    if not by and not job.chunk_rows:
        raise ConfigError("no chunks: give chunk_by (a column) or chunk_rows (a row count)")
    clash = [b for b in by if b in TABLE_COLUMNS]
    if clash:
        # The tables begin with the chunk's keys: one named like a column of theirs
        # would be overwritten by it (chunk_by = "term": every key lost).
        raise ConfigError(
            f"chunk_by column {clash[0]!r} has the name of a column of the results' "
            "tables; rename it in the data"
        )


def needed_columns(spec: ModelSpec, by: list[str]) -> tuple[dict[str, str], FormulaInfo | None]:
    """The columns the job reads, each with what needs it; and the formula's analysis."""
    needed: dict[str, str] = {}
    info = None
    if spec.formula:
        info = analyze_formula(spec.formula)
        needed.update({c: "formula" for c in info.columns})
    else:
        needed[spec.endog] = "endog"
        needed.update({c: "exog" for c in spec.exog})
    for col, why in ((spec.weights, "weights"), (spec.cluster, "cluster")):
        if col:
            needed[col] = why
    for b in by:
        needed.setdefault(b, "chunk_by")
    return needed, info


def check_numeric(ds: Dataset, spec: ModelSpec) -> None:
    """The response, regressors and weights named outside a formula are numbers."""
    numeric = [c for c in (spec.endog, *spec.exog, spec.weights) if c]
    for c in numeric:
        t = ds.schema.field(c).type
        if not (
            pa.types.is_floating(t)
            or pa.types.is_integer(t)
            or pa.types.is_boolean(t)
            or pa.types.is_decimal(t)
        ):
            raise InputError(
                f"dataset {ds.describe()}: column {c!r} is {t}, not numeric"
                + (f"; use a formula with C({c})" if c in spec.exog else "")
            )


def check_chunk_sizes(dataset: Dataset, index: ChunkIndex, first: Prepared | None) -> None:
    """Refuse chunks too small for any fit: chunk_by on a key of a row or two (a
    timestamp) made every chunk fail, after the run, with TooFewRows. ``first``:
    the first chunk's arrays, whose columns are every chunk's (no categorical
    factor); else a chunk has at least one parameter."""
    if index.rows is not None:
        most = int(index.rows.max())
    elif index.chunk_rows:
        most = min(index.chunk_rows, index.total_rows)
    else:
        most = -(-index.total_rows // index.n_chunks)
    k = first.X.shape[1] if first is not None else 1
    if most > k:
        return
    rows = f"{most} row{'s' if most > 1 else ''}"
    if index.chunk_rows:
        how = f"chunk_rows = {index.chunk_rows} gives chunks of {rows}"
    else:
        by = ", ".join(index.by)
        how = f"chunk_by {by!r} gives {index.n_chunks:,} chunks of at most {rows}"
    raise InputError(
        f"dataset {dataset.describe()}: {how}, and the model has {k} "
        f"parameter{'s' if k > 1 else ''}: a fit needs more rows than parameters, so "
        "every chunk would fail (TooFewRows); chunk by a coarser key or more rows"
    )


def check_formula(spec: ModelSpec, rows) -> None:
    """patsy's own evaluation of the formula on ``rows``: a ConfigError that says what
    is wrong with it, if anything is."""
    import patsy

    from .design import patsy_frame
    from .spec import eval_env, model_desc

    try:
        with quiet_math():
            # Missing values dropped, as statsmodels does: a null is not a level, nor a
            # value outside C(x, levels=...)'s (both were refused before any task)
            y, _ = patsy.dmatrices(
                model_desc(spec.formula),
                patsy_frame(rows.table),
                eval_env=eval_env(),
                NA_action="drop",
                return_type="matrix",
            )
    except Exception as exc:
        raise ConfigError(
            f"formula {spec.formula!r} cannot be evaluated on the data: {type(exc).__name__}: {exc}"
        ) from None
    if y.shape[1] != 1:
        names = y.design_info.column_names
        response = spec.formula.split("~", 1)[0].strip()
        if response.startswith("I(") and response.endswith(")"):
            response = response[2:-1]
        hint = ""
        if len(names) == 2 and names[0].endswith("[False]") and names[1].endswith("[True]"):
            # patsy codes a True/False response as two columns, as statsmodels sees it
            hint = f"; a True/False response is fitted as 0/1: write I(({response}) * 1)"
        if response in rows.table.column_names:
            kind = rows.table.schema.field(response).type
            what = f"column {response!r} is {kind}, which patsy codes as"
        else:
            what = "it gives"
        shown = ", ".join(names[:3]) + (f", ... ({len(names) - 3} more)" if len(names) > 3 else "")
        raise ConfigError(
            f"formula {spec.formula!r}: the response must be numeric ({what} "
            f"{y.shape[1]} columns: {shown}){hint}"
        )
