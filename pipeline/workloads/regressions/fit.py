"""Fitting one chunk with statsmodels (:func:`fit_chunk`), and classifying the chunks
that cannot be fitted: it never raises, a chunk that cannot be fitted is a
:class:`~.chunkfit.ChunkFit` with ``error_type``/``error_message``. The checks of
:mod:`.chunkchecks` run first; then statsmodels' own exceptions and warnings
(non-convergence, perfect separation) are classified.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace

import numpy as np

from . import lsq
from .chunkchecks import check_chunk, check_leverage, singular
from .chunkfit import ChunkFit, dropped_warning
from .design import ChunkError, Prepared
from .spec import FAMILIES, LINKS, ModelSpec

__all__ = ["DEFAULT_METHODS", "LeastSquares", "fit_chunk", "fit_kwargs"]

#: statsmodels' fit method by model, where ``fit_options`` name none.
DEFAULT_METHODS = {"ols": "pinv", "wls": "pinv", "glm": "IRLS", "logit": "newton",
                   "probit": "newton", "poisson": "newton", "quantreg": "IRLS",
                   "rlm": "IRLS"}  # fmt: skip


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
                check_leverage(spec, model)
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
