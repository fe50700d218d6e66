"""Fitting one chunk with statsmodels, and classifying the chunks that cannot be fitted.

:class:`ChunkFit` is one chunk's result (a models-table row and its coefficients).
A chunk that cannot be fitted is a ``ChunkFit`` with ``error_type``/``error_message``
and no coefficients; it never raises. Checks run before statsmodels, in order:
no rows, non-finite values, too few rows, constant response, rank-deficient design;
then statsmodels' own exceptions and warnings (non-convergence, perfect separation).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from .spec import FAMILIES, LINKS, ModelSpec

__all__ = ["ChunkFit", "Prepared", "check_chunk", "fit_chunk", "finish_inference"]


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


@dataclass
class ChunkFit:
    nobs: int = 0
    nobs_dropped: int = 0
    df_model: float = np.nan
    df_resid: float = np.nan
    rsquared: float = np.nan
    rsquared_adj: float = np.nan
    rsquared_kind: str | None = None
    llf: float = np.nan
    aic: float = np.nan
    bic: float = np.nan
    condition_number: float = np.nan
    converged: bool | None = None
    warnings: str | None = None
    fit_seconds: float = 0.0
    error_type: str | None = None
    error_message: str | None = None
    terms: tuple[str, ...] = ()
    params: np.ndarray | None = None
    bse: np.ndarray | None = None
    statistic: np.ndarray | None = None
    p_value: np.ndarray | None = None
    ci_low: np.ndarray | None = None
    ci_high: np.ndarray | None = None
    # Deferred inference (linear models): p-values and intervals computed per task at once.
    use_t: bool = True
    df_inference: float = np.nan
    resid: np.ndarray | None = field(default=None, repr=False)
    fitted: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def failed(cls, error_type: str, message: str, **kw) -> ChunkFit:
        return cls(error_type=error_type, error_message=message, **kw)

    @property
    def ok(self) -> bool:
        return self.error_type is None


def _count_bad(a: np.ndarray) -> tuple[int, int]:
    nan = int(np.isnan(a).sum())
    return nan, int(a.size - nan - np.isfinite(a).sum())


def check_chunk(p: Prepared, spec: ModelSpec, *, svd: bool = True) -> np.ndarray | None:
    """Raise :class:`ChunkError` for a chunk that cannot be fitted; return X's singular values."""
    n, k = p.X.shape
    if n == 0:
        extra = f" ({p.dropped} rows dropped for missing values)" if p.dropped else ""
        raise ChunkError("EmptyChunk", f"no rows to fit{extra}")
    problems = []
    for label, arr in (("response", p.y), ("weights", p.weights)):
        if arr is not None and not np.isfinite(arr).all():
            nan, inf = _count_bad(arr)
            problems.append(f"{label}: {nan} NaN, {inf} inf")
    if not np.isfinite(p.X).all():
        for j, name in enumerate(p.names):
            col = p.X[:, j]
            if not np.isfinite(col).all():
                nan, inf = _count_bad(col)
                problems.append(f"{name}: {nan} NaN, {inf} inf")
    if problems:
        hint = "" if spec.missing == "drop" else " (missing = fail)"
        raise ChunkError("NonFiniteValues", f"non-finite values{hint}: {'; '.join(problems)}")
    if n <= k:
        raise ChunkError(
            "TooFewRows",
            f"{n} rows for {k} parameters: need at least {k + 1}"
            + (f" ({p.dropped} rows dropped for missing values)" if p.dropped else ""),
        )
    if spec.model != "quantreg" and np.all(p.y == p.y[0]):
        raise ChunkError(
            "ConstantResponse", f"the response is constant ({p.y[0]!r} in all {n} rows)"
        )
    if p.weights is not None and (p.weights <= 0).any():
        raise ChunkError("BadWeights", f"{int((p.weights <= 0).sum())} weights are not positive")
    if not svd:
        return None
    sv = np.linalg.svd(p.X, compute_uv=False)
    tol = sv.max(initial=0.0) * max(n, k) * np.finfo(float).eps
    rank = int((sv > tol).sum())
    if rank < k:
        singular(p, rank)
    return sv


def singular(p: Prepared, rank: int) -> None:
    """Raise SingularDesign naming the collinear columns."""
    k = p.X.shape[1]
    _, _, vt = np.linalg.svd(p.X, full_matrices=False)
    null = np.abs(vt[rank:]).max(axis=0)
    involved = [p.names[j] for j in np.flatnonzero(null > 1e-8)]
    zero = [p.names[j] for j in range(k) if not p.X[:, j].any()]
    why = f"; all-zero columns: {', '.join(zero)}" if zero else ""
    raise ChunkError(
        "SingularDesign",
        f"the design matrix has rank {rank} < {k} columns (collinear: {', '.join(involved)}{why})",
    )


def _make_model(spec: ModelSpec, p: Prepared):
    import statsmodels.api as sm

    m = spec.model
    if m == "ols":
        return sm.OLS(p.y, p.X)
    if m == "wls":
        return sm.WLS(p.y, p.X, weights=p.weights)
    if m == "glm":
        family_cls = getattr(sm.families, FAMILIES[spec.family])
        if spec.link:
            family = family_cls(link=getattr(sm.families.links, LINKS[spec.link])())
        else:
            family = family_cls()
        return sm.GLM(p.y, p.X, family=family)
    if m in ("logit", "probit", "poisson"):
        return {"logit": sm.Logit, "probit": sm.Probit, "poisson": sm.Poisson}[m](p.y, p.X)
    if m == "quantreg":
        return sm.QuantReg(p.y, p.X)
    if m == "rlm":
        return sm.RLM(p.y, p.X, M=getattr(sm.robust.norms, spec.norm)())
    raise ValueError(m)


def fit_kwargs(spec: ModelSpec, p: Prepared) -> dict:
    kw = dict(spec.fit_options)
    if spec.model in ("logit", "probit", "poisson"):
        kw.setdefault("disp", 0)
    if spec.model == "quantreg":
        kw["q"] = spec.q
    if spec.cov_type != "nonrobust":
        kw["cov_type"] = spec.cov_type
        if spec.cov_type == "HAC":
            kw["cov_kwds"] = {"maxlags": spec.maxlags}
        elif spec.cov_type == "cluster":
            kw["cov_kwds"] = {"groups": p.groups}
    return kw


_SEPARATION = ("PerfectSeparation",)


def fit_chunk(spec: ModelSpec, p: Prepared, *, keep_resid: bool = False) -> ChunkFit:
    """Fit one prepared chunk; never raises."""
    t0 = time.perf_counter()
    try:
        # Linear models: statsmodels' pinv computes the rank (checked after the fit).
        sv = check_chunk(p, spec, svd=not spec.linear)
    except ChunkError as exc:
        return ChunkFit.failed(
            exc.error_type,
            exc.message,
            nobs=len(p.y),
            nobs_dropped=p.dropped,
            fit_seconds=time.perf_counter() - t0,
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = _make_model(spec, p)
            res = model.fit(**fit_kwargs(spec, p))
            if spec.linear and model.rank < p.X.shape[1]:
                singular(p, model.rank)
            out = _extract(spec, getattr(res, "_results", res), p, sv)
            if _separated(spec, res):
                out.converged = False
                caught.append(
                    warnings.WarningMessage(
                        "all fitted probabilities are 0 or 1 (complete separation)",
                        type("PerfectSeparationWarning", (Warning,), {}),
                        "",
                        0,
                    )
                )
            if keep_resid:
                out.resid, out.fitted = _resid_fitted(spec, res, p)
        except ChunkError as exc:
            out = ChunkFit.failed(exc.error_type, exc.message)
        except Exception as exc:  # statsmodels' own errors, recorded per chunk
            out = ChunkFit.failed(_classify(exc), f"{type(exc).__name__}: {exc}")
    out.nobs = len(p.y)
    out.nobs_dropped = p.dropped
    messages = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
    if p.dropped:
        messages.insert(0, f"dropped {p.dropped} rows with missing values")
    out.warnings = " | ".join(messages) or None
    if out.ok:
        names = {w.category.__name__ for w in caught}
        if "IterationLimitWarning" in names:
            out.converged = False
        if names & {"PerfectSeparationWarning"}:
            out.error_type = "PerfectSeparation"
            out.error_message = "perfect separation: the MLE does not exist; " + "; ".join(
                str(w.message) for w in caught if w.category.__name__ == "PerfectSeparationWarning"
            )
        elif out.converged is False:
            conv = [str(w.message) for w in caught if "Convergence" in w.category.__name__]
            out.error_type = "NotConverged"
            out.error_message = "the fit did not converge" + (f": {conv[0]}" if conv else "")
        elif not (np.isfinite(out.params).all() and np.isfinite(out.bse).all()):
            out.error_type = "NonFiniteEstimates"
            out.error_message = "estimates or standard errors are not finite"
        if not out.ok:
            out.params = out.bse = out.statistic = out.p_value = out.ci_low = out.ci_high = None
            out.terms = ()
    out.fit_seconds = time.perf_counter() - t0
    return out


def _separated(spec: ModelSpec, res) -> bool:
    """Binary models: every fitted probability is 0 or 1, so the MLE does not exist."""
    if spec.model not in ("logit", "probit") and not (
        spec.model == "glm" and spec.family == "binomial"
    ):
        return False
    try:
        mu = np.asarray(res.predict(), dtype=float)
    except Exception:
        return False
    return bool(np.all((mu < 1e-6) | (mu > 1 - 1e-6)))


def _classify(exc: Exception) -> str:
    name = type(exc).__name__
    if name == "LinAlgError":
        return "SingularDesign"
    if name == "PerfectSeparationError":
        return "PerfectSeparation"
    return name


def _scalar(res, name: str) -> float:
    try:
        value = getattr(res, name)
        return float(value() if callable(value) else value)
    except Exception:
        return np.nan


def _extract(spec: ModelSpec, res, p: Prepared, sv: np.ndarray) -> ChunkFit:
    out = ChunkFit(terms=p.names)
    out.params = np.asarray(res.params, dtype=float)
    out.bse = np.asarray(res.bse, dtype=float)
    out.statistic = np.asarray(res.tvalues, dtype=float)
    out.df_model = _scalar(res, "df_model")
    out.df_resid = _scalar(res, "df_resid")
    if sv is not None:
        out.condition_number = float(sv[0] / sv[-1]) if sv[-1] > 0 else np.inf
    if spec.linear:
        out.use_t = bool(res.use_t)
        out.df_inference = float(getattr(res, "df_resid_inference", res.df_resid))
        out.rsquared, out.rsquared_adj = float(res.rsquared), float(res.rsquared_adj)
        out.rsquared_kind = "r2"
        out.converged = True
        out.condition_number = float(res.condition_number)
    else:
        out.p_value = np.asarray(res.pvalues, dtype=float)
        ci = np.asarray(res.conf_int(spec.alpha), dtype=float)
        out.ci_low, out.ci_high = ci[:, 0], ci[:, 1]
        if spec.model in ("logit", "probit", "poisson"):
            out.rsquared, out.rsquared_kind = _scalar(res, "prsquared"), "mcfadden"
            out.converged = bool(res.mle_retvals.get("converged", True))
        elif spec.model == "glm":
            out.rsquared, out.rsquared_kind = _scalar(res, "pseudo_rsquared"), "cox-snell"
            out.converged = bool(getattr(res, "converged", True))
        elif spec.model == "quantreg":
            out.rsquared, out.rsquared_kind = _scalar(res, "prsquared"), "koenker-machado"
            out.converged = True  # unless an IterationLimitWarning says otherwise
        elif spec.model == "rlm":
            hist = getattr(res, "fit_history", {}) or {}
            maxiter = dict(spec.fit_options).get("maxiter", 50)
            out.converged = hist.get("iteration", 0) < maxiter
    out.llf = _scalar(res, "llf")
    out.aic = _scalar(res, "aic")
    out.bic = _scalar(res, "bic")
    return out


def _resid_fitted(spec: ModelSpec, res, p: Prepared):
    try:
        fitted = np.asarray(res.fittedvalues, dtype=float)
    except Exception:
        fitted = np.asarray(res.predict(), dtype=float)
    resid = np.asarray(res.resid_pearson, dtype=float) if spec.model == "glm" else p.y - fitted
    return resid, fitted


def finish_inference(fits: list[ChunkFit], alpha: float) -> None:
    """p-values and intervals of the linear fits, all at once (what statsmodels'
    ``pvalues`` and ``conf_int`` compute, elementwise, per chunk)."""
    todo = [f for f in fits if f.ok and f.p_value is None]
    if not todo:
        return
    sizes = [len(f.params) for f in todo]
    stat = np.concatenate([f.statistic for f in todo])
    params = np.concatenate([f.params for f in todo])
    bse = np.concatenate([f.bse for f in todo])
    use_t = np.repeat([f.use_t for f in todo], sizes)
    df = np.repeat([f.df_inference for f in todo], sizes)
    with np.errstate(all="ignore"):
        pt = stats.t.sf(np.abs(stat), df) * 2
        pn = stats.norm.sf(np.abs(stat)) * 2
        qt = stats.t.ppf(1 - alpha / 2, df)
        qn = stats.norm.ppf(1 - alpha / 2)
    pval = np.where(use_t, pt, pn)
    q = np.where(use_t, qt, qn)
    low, high = params - q * bse, params + q * bse
    bounds = np.cumsum([0, *sizes])
    for f, a, b in zip(todo, bounds[:-1], bounds[1:], strict=True):
        f.p_value, f.ci_low, f.ci_high = pval[a:b], low[a:b], high[a:b]


def from_batched(r, p: Prepared, alpha: float, use_t: bool, seconds: float) -> ChunkFit:
    """A :class:`ChunkFit` from the batched engine's result for one chunk."""
    out = ChunkFit(
        nobs=int(r.nobs),
        nobs_dropped=p.dropped,
        df_model=float(r.df_model),
        df_resid=float(r.df_resid),
        rsquared=float(r.rsquared),
        rsquared_adj=float(r.rsquared_adj),
        rsquared_kind="r2",
        llf=float(r.llf),
        aic=float(r.aic),
        bic=float(r.bic),
        condition_number=float(r.condition_number),
        converged=True,
        terms=p.names,
        params=np.asarray(r.params),
        bse=np.asarray(r.bse),
        statistic=np.asarray(r.tvalues),
        fit_seconds=seconds,
        warnings=f"dropped {p.dropped} rows with missing values" if p.dropped else None,
    )
    if alpha == 0.05:
        out.p_value = np.asarray(r.pvalues)
        ci = np.asarray(r.conf_int)
        out.ci_low, out.ci_high = ci[:, 0], ci[:, 1]
    else:  # the engine's intervals are 95 %: recompute like statsmodels (t for nonrobust)
        out.use_t = use_t
        out.df_inference = float(r.df_resid)
    return out


# -- designs -----------------------------------------------------------------------------


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


def _keep_all_na():
    import patsy.missing

    return patsy.missing.NAAction(NA_types=[])


class TaskDesign:
    """The design matrices of a task's chunks, built once per task where that gives the
    same matrices as building them per chunk (see the package docs), else per chunk."""

    def __init__(self, spec: ModelSpec, table, offsets: np.ndarray, info=None):
        self.spec = spec
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
            self.df = table.to_pandas()
            self.exact = info.exact_only if info is not None else False
            if not self.exact:
                try:
                    self._formula_once()
                except Exception:
                    self.exact = True  # e.g. missing categories: per chunk, as statsmodels would

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
        from patsy.categorical import categorical_to_int

        from .spec import model_desc

        desc = model_desc(self.spec.formula)
        coded = _sorted_categoricals(self.df)
        y, X = patsy.dmatrices(
            desc,
            coded,
            eval_env=_fast_env(),
            NA_action=_keep_all_na(),
            return_type="matrix",
        )
        if y.shape[1] != 1:
            raise ValueError("categorical response")
        self.yg = np.ascontiguousarray(np.asarray(y)[:, 0], dtype=np.float64)
        self.Xg = np.ascontiguousarray(np.asarray(X), dtype=np.float64)
        info = X.design_info
        self.names = tuple(info.column_names)
        self.rhs = patsy.ModelDesc([], desc.rhs_termlist)
        # Per categorical factor, each row's level; a chunk missing some levels gets the
        # columns a design built on that chunk alone would have (cached per level set).
        self.factor_codes = []
        chunk_of_row = np.repeat(np.arange(self.n), np.diff(self.offsets))
        self.signature = np.zeros((self.n, 0), dtype=bool)
        for factor, fi in info.factor_infos.items():
            if fi.type != "categorical":
                continue
            values = factor.eval(fi.state, coded)
            values = (
                getattr(values, "data", values)
                if type(values).__name__ == "_CategoricalBox"
                else values
            )
            codes = np.asarray(categorical_to_int(values, fi.categories, _keep_all_na(), factor))
            n_levels = len(fi.categories)
            present = (
                np.bincount(chunk_of_row * n_levels + codes, minlength=self.n * n_levels).reshape(
                    self.n, n_levels
                )
                > 0
            )
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
            names = patsy.dmatrix(
                self.rhs, self.df.iloc[s:e], eval_env=eval_env(), NA_action=_keep_all_na()
            ).design_info.column_names
            where = {n: j for j, n in enumerate(self.names)}
            self._columns[sig] = (
                np.array([where[n] for n in names], dtype=np.intp)
                if all(n in where for n in names)
                else None
            )
        return self._columns[sig]

    def prepare(self, i: int) -> Prepared:
        """Chunk ``i``'s arrays; raises :class:`ChunkError` if they cannot be built."""
        s, e = int(self.offsets[i]), int(self.offsets[i + 1])
        if self.exact:
            return self._prepare_exact(s, e)
        names, X = self.names, self.Xg[s:e]
        if self.factor_codes and not self.full[i]:
            cols = self._chunk_columns(i, s, e)
            if cols is None:
                return self._prepare_exact(s, e)
            names, X = tuple(self.names[j] for j in cols), X[:, cols]
        y = self.yg[s:e]
        w = self.weights[s:e] if self.weights is not None else None
        g = self.groups[s:e] if self.groups is not None else None
        return self._drop_missing(y, X, names, w, g)

    def _drop_missing(self, y, X, names, w, g, dropped: int = 0) -> Prepared:
        if self.spec.missing == "drop":
            bad = np.isnan(y) | np.isnan(X).any(axis=1)
            if w is not None:
                bad |= np.isnan(w)
            if g is not None:
                bad |= _isnull(g)
            if bad.any():
                keep = ~bad
                y, X = y[keep], X[keep]
                w = w[keep] if w is not None else None
                g = g[keep] if g is not None else None
                dropped += int(bad.sum())
        return Prepared(y, X, names, w, g, dropped)

    def _prepare_exact(self, s: int, e: int) -> Prepared:
        import patsy

        from .spec import eval_env, model_desc

        chunk = self.df.iloc[s:e]
        na = _RecordingNA() if self.spec.missing == "drop" else _keep_all_na()
        try:
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
        dropped = int(mask.sum()) if mask is not None else 0
        return self._drop_missing(
            np.asarray(y, dtype=float)[:, 0],
            np.asarray(X, dtype=float),
            tuple(X.design_info.column_names),
            w,
            g,
            dropped,
        )


def _isnull(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return np.isnan(a)
    if a.dtype.kind == "O":
        import pandas as pd

        return np.asarray(pd.isna(a))
    return np.zeros(a.shape, dtype=bool)


def _sorted_categoricals(df):
    """``df`` with its string columns as categoricals whose categories are the sorted
    distinct values: patsy then codes them as it codes the strings (levels sorted),
    but vectorized instead of one Python call per row."""
    import pandas as pd

    out = df.copy(deep=False)
    for name in df.columns:
        col = df[name]
        if pd.api.types.is_string_dtype(col.dtype) and not isinstance(
            col.dtype, pd.CategoricalDtype
        ):
            if col.isna().any():
                continue  # patsy's own NA handling decides
            levels = sorted(pd.unique(col))
            out[name] = pd.Categorical(col, categories=levels)
    return out


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
