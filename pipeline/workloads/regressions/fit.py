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
from dataclasses import dataclass, field, replace

import numpy as np

from . import lsq
from .design import ChunkError, Prepared
from .spec import FAMILIES, LINKS, ModelSpec

__all__ = ["ChunkFit", "Prepared", "batched_method", "check_chunk", "fit_chunk", "finish_inference"]

#: statsmodels' fit method by model, where ``fit_options`` name none.
DEFAULT_METHODS = {"ols": "pinv", "wls": "pinv", "glm": "IRLS", "logit": "newton",
                   "probit": "newton", "poisson": "newton", "quantreg": "IRLS",
                   "rlm": "IRLS"}  # fmt: skip


def batched_method(refined: bool) -> str:
    """The models table's ``method`` of a chunk the batched engine fitted."""
    return "qr+refined" if refined else "qr"


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
    engine: str | None = None  # "statsmodels" or "batched": what fitted it (None: nothing did)
    method: str | None = None  # how: "qr", "pinv", "newton", ...; "+refined" (see .lsq)
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


#: The responses a model's likelihood is defined on: (low, high, whether low is allowed,
#: what to say).
_UNIT_INTERVAL = (0.0, 1.0, True, "in [0, 1] (0/1 outcomes or proportions)")
_COUNTS = (0.0, np.inf, True, "at least 0 (counts)")
_POSITIVE = (0.0, np.inf, False, "above 0")
_RESPONSE_DOMAINS = {
    "logit": _UNIT_INTERVAL,
    "probit": _UNIT_INTERVAL,
    "poisson": _COUNTS,
    "glm:binomial": _UNIT_INTERVAL,
    "glm:poisson": _COUNTS,
    "glm:negative_binomial": _COUNTS,
    "glm:gamma": _POSITIVE,
    "glm:inverse_gaussian": _POSITIVE,
}


def _check_response_domain(spec, y: np.ndarray) -> None:
    """A response its model is not defined on fails the chunk, naming the values: the
    fit would stop on a message about its internals, or return estimates of nothing."""
    model = f"glm:{spec.family}" if spec.model == "glm" else spec.model
    domain = _RESPONSE_DOMAINS.get(model)
    if domain is None:
        return
    low, high, low_ok, wanted = domain
    outside = (y > high) | ((y < low) if low_ok else (y <= low))
    if outside.any():
        example = y[np.argmax(outside)]
        name = model.replace("glm:", "glm with family ")
        raise ChunkError(
            "BadResponse",
            f"{name} needs a response {wanted}; {int(outside.sum())} of {len(y)} rows are "
            f"not (e.g. {example:g})",
        )


def _count_bad(a: np.ndarray) -> tuple[int, int]:
    nan = int(np.isnan(a).sum())
    return nan, int(a.size - nan - np.isfinite(a).sum())


def _plain(value):
    """A numpy scalar as the Python value it holds: its repr is np.float64(4.0)."""
    return value.item() if isinstance(value, np.generic) else value


def check_chunk(p: Prepared, spec: ModelSpec, *, svd: bool = True) -> np.ndarray | None:
    """Raise :class:`ChunkError` for a chunk that cannot be fitted; return X's singular values."""
    n, k = p.X.shape
    if n == 0:
        extra = f" ({p.dropped} rows dropped for missing values)" if p.dropped else ""
        raise ChunkError("EmptyChunk", f"no rows to fit{extra}")
    problems = []
    for label, arr in () if p.finite else (("response", p.y), ("weights", p.weights)):
        if arr is not None and not np.isfinite(arr).all():
            nan, inf = _count_bad(arr)
            problems.append(f"{label}: {nan} NaN, {inf} inf")
    if not p.finite and not np.isfinite(p.X).all():
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
            "ConstantResponse", f"the response is constant ({p.y[0].item()!r} in all {n} rows)"
        )
    _check_response_domain(spec, p.y)
    if p.groups is not None and len(p.groups):
        clusters = len(np.unique(p.groups))
        if clusters < 2:  # statsmodels: "ZeroDivisionError: float division by zero"
            raise ChunkError(
                "TooFewClusters",
                f"1 cluster ({spec.cluster} = {_plain(p.groups[0])!r}) in this chunk: "
                "cluster-robust errors need at least 2",
            )
    X = p.X
    if p.weights is not None:
        negative = int((p.weights < 0).sum())
        if negative:
            raise ChunkError("BadWeights", f"{negative} weights are negative")
        # Rows of weight 0 are kept, and counted in nobs, as statsmodels does; the
        # fit itself rests on the others.
        kept = p.weights > 0
        if kept.sum() <= k:
            raise ChunkError(
                "TooFewRows",
                f"{int(kept.sum())} rows of positive weight for {k} parameters: need at "
                f"least {k + 1} ({n - int(kept.sum())} weights are 0)",
            )
        X = X if kept.all() else X[kept]
    if not svd:
        return None
    sv = np.linalg.svd(X, compute_uv=False)
    tol = sv.max(initial=0.0) * max(n, k) * np.finfo(float).eps
    rank = int((sv > tol).sum())
    if rank < k:
        singular(p, rank, X)
    return sv


def _check_leverage(spec: ModelSpec, model) -> None:
    """HC2 and HC3 divide each squared residual by 1 - h_ii: a row fitted exactly
    (h_ii = 1: the one row of a category) gives standard errors that are rounding
    noise (16 % apart from statsmodels' own, from the same data), said as fitted."""
    from .stack import MAX_LEVERAGE

    pinv = getattr(model, "pinv_wexog", None)  # (not made by fit(method="qr"))
    pinv = np.linalg.pinv(model.wexog) if pinv is None else pinv
    h = np.einsum("ij,ji->i", model.wexog, pinv)  # as statsmodels' HC2/HC3 find them
    row = int(np.argmax(h))
    if h[row] > MAX_LEVERAGE:
        raise ChunkError(
            "HighLeverage",
            f"row {row} of the chunk has leverage {h[row]:.6g}: it is fitted exactly (a "
            f"category level with one row?), and {spec.cov_type} divides by 1 - h_ii; "
            "HC1 or HC0 does not",
        )


def singular(p: Prepared, rank: int, X: np.ndarray | None = None) -> None:
    """Raise SingularDesign naming the collinear columns (of ``X``: the rows that
    count, when some weigh nothing): those in the null space of the column-scaled
    design, where a column's scale does not decide whether it shows."""
    if X is None:
        X = p.X if p.weights is None else p.X[p.weights > 0]
    k = X.shape[1]
    _, _, vt = np.linalg.svd(X * lsq.column_scales(X[None])[0], full_matrices=False)
    null = np.abs(vt[rank:]).max(axis=0)
    involved = [p.names[j] for j in np.flatnonzero(null > 1e-8)]
    zero = [p.names[j] for j in range(k) if not X[:, j].any()]
    why = f"; all-zero columns: {', '.join(zero)}" if zero else ""
    raise ChunkError(
        "SingularDesign",
        f"the design matrix has rank {rank} < {k} columns (collinear: {', '.join(involved)}{why})",
    )


def _make_model(spec: ModelSpec, p: Prepared):
    import statsmodels.api as sm

    if spec.formula is not None:
        # In the column-major layout smf's models get (patsy's frame as an array): the
        # iterative fits (quantreg, rlm, GLM) round otherwise, and stop a step apart
        # (3e-7 relative on a quantreg estimate, 1.7e-4 on its p-value)
        p = replace(p, X=np.asfortranarray(p.X))
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


class LeastSquares:
    """OLS and WLS through statsmodels, on the column-scaled design (:mod:`.lsq`): the
    rank decided there (SingularDesign naming the collinear columns, as before the
    fit), statsmodels' estimates of the scaled design scaled back (exactly: powers of
    two), refined where the error bound asks for it, and statsmodels' condition
    number of the design as given."""

    def __init__(self, p: Prepared):
        X, y = p.X, p.y
        if p.weights is not None:  # statsmodels' WLS.whiten (rows of weight 0 are zeros)
            sw = np.sqrt(p.weights)
            X, y = sw[:, None] * X, y * sw
        self.y = y[None]
        self.factor = f = lsq.factor(X[None], self.y)
        if f.rank[0] < X.shape[1]:
            singular(p, int(f.rank[0]))

    def finish(self, out: ChunkFit) -> str:
        """Scale ``out``'s estimates and errors back, refine; the method's suffix."""
        f = self.factor
        b = out.params  # of the scaled design
        refined = bool(lsq.needs_refinement(f, b[None])[0])
        if refined:
            b = lsq.refine(f.Xs, f.Rinv, self.y, b[None])[0][0]
        out.params, out.bse = b * f.d[0], out.bse * f.d[0]
        out.statistic = out.params / out.bse
        s = f.singular_values()[0]
        out.condition_number = float(s[0] / s[-1]) if s[-1] > 0 else np.inf
        return "+refined" if refined else ""


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


def dropped_warning(p: Prepared) -> str | None:
    """The models table's note of a chunk's rows dropped for missing values, failed or not."""
    rows = "row" if p.dropped == 1 else "rows"
    return f"dropped {p.dropped} {rows} with missing values" if p.dropped else None


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
            warnings=dropped_warning(p),
            fit_seconds=time.perf_counter() - t0,
        )
    method = dict(spec.fit_options).get("method", DEFAULT_METHODS[spec.model])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            scaled = spec.model in ("ols", "wls")
            if scaled:  # on the column-scaled design: see .lsq
                least = LeastSquares(p)
                model = _make_model(spec, replace(p, X=p.X * least.factor.d[0]))
            else:
                model = _make_model(spec, p)
            res = model.fit(**fit_kwargs(spec, p))
            if spec.linear and not scaled and model.rank < p.X.shape[1]:
                singular(p, model.rank)
            if spec.linear and spec.cov_type in ("HC2", "HC3"):
                _check_leverage(spec, model)
            out = _extract(spec, getattr(res, "_results", res), p, sv)
            if scaled:
                method += least.finish(out)
            separated = _separated(spec, res)
            if separated:
                out.converged = False
                caught.append(
                    warnings.WarningMessage(
                        separated,
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
            out = ChunkFit.failed(*_classify(exc))
    out.nobs = len(p.y)
    out.nobs_dropped = p.dropped
    out.engine = "statsmodels"
    out.method = method
    messages = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
    if p.dropped:
        messages.insert(0, dropped_warning(p))
    out.warnings = " | ".join(messages) or None
    if out.ok:
        names = {w.category.__name__ for w in caught}
        if "IterationLimitWarning" in names:
            out.converged = False
        if names & {"PerfectSeparationWarning"}:
            out.error_type = "PerfectSeparation"
            said = (
                str(w.message) for w in caught if w.category.__name__ == "PerfectSeparationWarning"
            )
            out.error_message = "perfect separation: the MLE does not exist; " + "; ".join(
                dict.fromkeys(said)
            )
        elif out.converged is False:
            limits = ("Convergence", "IterationLimit")
            it = "max_iter" if spec.model == "quantreg" else "maxiter"  # statsmodels' names
            conv = [str(w.message) for w in caught if any(n in w.category.__name__ for n in limits)]
            out.error_type = "NotConverged"
            given = dict(spec.fit_options).get(it)
            more = f"more iterations: fit_options = {{{it} = N}} (--fit-options {it}=N)"
            if given is not None:
                more += f", above the {given} given"
            if spec.model in ("logit", "probit"):
                # more iterations then only push an estimate further out
                more += (
                    "; if they do not help, the response never varies within a level or a "
                    "range of a regressor in this chunk (quasi-separation): no finite estimate"
                )
            out.error_message = (
                "the fit did not converge"
                + (f": {conv[0].rstrip('.')}" if conv else "")
                + f"; {more}"
            )
        elif not (np.isfinite(out.params).all() and np.isfinite(out.bse).all()):
            out.error_type = "NonFiniteEstimates"
            out.error_message = "estimates or standard errors are not finite"
        if not out.ok:
            out.params = out.bse = out.statistic = out.p_value = out.ci_low = out.ci_high = None
            out.terms = ()
    out.fit_seconds = time.perf_counter() - t0
    return out


def _separated(spec: ModelSpec, res) -> str | None:
    """Binary models: why the MLE does not exist, if the data are separated."""
    if spec.model not in ("logit", "probit") and not (
        spec.model == "glm" and spec.family == "binomial"
    ):
        return None
    try:
        mu = np.asarray(res.predict(), dtype=float)
        y = np.asarray(res.model.endog, dtype=float)
    except Exception:
        return None
    if np.all((mu < 1e-6) | (mu > 1 - 1e-6)):
        return "all fitted probabilities are 0 or 1 (complete separation)"
    # Estimates that classify every observation of a 0/1 response are a hyperplane
    # separating the outcomes, so no maximum exists, whatever the optimizer said:
    # bfgs "converged" there, on estimates of 1e3 with standard errors of 1e8. (Not
    # of proportions, which a good fit "classifies" as well.)
    binary = np.isin(y, (0.0, 1.0)).all()
    if y.size and binary and np.all((mu > 0.5) == (y > 0.5)):
        return "the estimates classify every observation (complete separation)"
    return None


def _classify(exc: Exception) -> tuple[str, str]:
    """The error type to record and its message; the message names the exception's
    own type only where the recorded type is another one (a type said once)."""
    name = type(exc).__name__
    recorded = {"LinAlgError": "SingularDesign", "PerfectSeparationError": "PerfectSeparation"}
    kind = recorded.get(name, name)
    message = str(exc) or repr(exc)
    return kind, message if kind == name else f"{name}: {message}"


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
    from scipy import stats  # here: a second of imports that the CLI need not pay

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


def from_batched(r, p: Prepared, seconds: float) -> ChunkFit:
    """A :class:`ChunkFit` from the batched engine's result for one chunk (its intervals
    at the job's level, as the stacked chunks' are: the same bits by either way)."""
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
        engine="batched",
        method=batched_method(r.refined),
        warnings=dropped_warning(p),
    )
    out.p_value = np.asarray(r.pvalues)
    ci = np.asarray(r.conf_int)
    out.ci_low, out.ci_high = ci[:, 0], ci[:, 1]
    return out
