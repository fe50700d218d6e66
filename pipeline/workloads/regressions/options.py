"""``fit_options`` checked against the model's ``fit()`` before any task runs.

A wrong option would otherwise fail every chunk of the job with the same error
(``maxiter=abc`` -> "'<' not supported between 'int' and 'str'" 50 times over).
Two checks: the option's name and value against ``fit()``'s signature (its default
says what type is expected; some options have a fixed set of values), then a trial
fit of the first chunk with and without the options (:func:`check_trial_fit`).
"""

from __future__ import annotations

import inspect
from typing import Any

from ...errors import ConfigError
from .spec import ModelSpec

__all__ = ["check_fit_options", "check_trial_fit"]

_OPTIMIZER_METHODS = ("newton", "nm", "bfgs", "lbfgs", "powell", "cg", "ncg", "basinhopping",
                      "minimize")  # fmt: skip
#: Keyword options that statsmodels' optimizers read from ``**kwargs``.
_OPTIMIZER_KWARGS = {
    "T", "approx_grad", "avextol", "bounds", "epsilon", "fhess_p", "ftol", "gtol", "interval",
    "iprint", "loglike_and_score", "maxfun", "min_method", "minimizer", "niter",
    "niter_success", "norm", "ridge_factor", "seed", "start_direc", "stepsize", "tol", "xtol",
    "retall", "skip_hessian", "warn_convergence",
}  # fmt: skip
#: Options ``fit()`` takes through ``**kwargs``, by model (beyond its named parameters).
_EXTRA = {
    "ols": set(),
    "wls": set(),
    "glm": _OPTIMIZER_KWARGS | {"atol", "rtol", "attach_wls", "wls_method", "tol_criterion"},
    "logit": _OPTIMIZER_KWARGS,
    "probit": _OPTIMIZER_KWARGS,
    "poisson": _OPTIMIZER_KWARGS,
    "quantreg": set(),
    "rlm": set(),
}
#: Options whose value is one of a fixed set, by model (``None``: every model).
_CHOICES: dict[tuple[str | None, str], tuple[str, ...]] = {
    ("ols", "method"): ("pinv", "qr"),
    ("wls", "method"): ("pinv", "qr"),
    ("glm", "method"): ("IRLS", *_OPTIMIZER_METHODS),
    ("logit", "method"): _OPTIMIZER_METHODS,
    ("probit", "method"): _OPTIMIZER_METHODS,
    ("poisson", "method"): _OPTIMIZER_METHODS,
    ("quantreg", "vcov"): ("robust", "iid"),
    ("quantreg", "kernel"): ("epa", "cos", "gau", "par", "biw"),
    ("quantreg", "bandwidth"): ("hsheather", "bofinger", "chamberlain"),
    ("rlm", "scale_est"): ("mad", "huber"),
    ("rlm", "cov"): ("H1", "H2", "H3"),
    ("rlm", "conv"): ("dev", "coefs", "weights", "sresid"),
}
#: What a chunk's data can cause (maxiter=1 may legitimately leave a fit unconverged);
#: any other error that only the options cause is the options' fault.
_DATA_OUTCOMES = {"NotConverged", "PerfectSeparation", "NonFiniteEstimates", "SingularDesign"}
_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _model_class(model: str):
    import statsmodels.api as sm

    return {"ols": sm.OLS, "wls": sm.WLS, "glm": sm.GLM, "logit": sm.Logit, "probit": sm.Probit,
            "poisson": sm.Poisson, "quantreg": sm.QuantReg, "rlm": sm.RLM}[model]  # fmt: skip


def check_fit_options(spec: ModelSpec) -> None:
    """Raise :class:`ConfigError` naming the first option ``fit()`` cannot take."""
    if not spec.fit_options:
        return
    cls = _model_class(spec.model)
    params = {
        name: p.default
        for name, p in list(inspect.signature(cls.fit).parameters.items())[1:]
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }
    for name, value in spec.fit_options:
        where = f"fit_options: {name}={value!r}"
        if name not in params:
            if name in _EXTRA[spec.model]:
                continue
            takes = ", ".join(sorted(set(params) - {"cov_type", "cov_kwds", "q"}))
            raise ConfigError(
                f"{where}: {cls.__name__}.fit() has no option {name!r} (model {spec.model} "
                f"takes: {takes})"
            )
        choices = _CHOICES.get((spec.model, name))
        if choices is not None:
            if value not in choices:
                raise ConfigError(f"{where}: expected one of {', '.join(choices)}")
            continue
        _check_type(where, params[name], value)


def _check_type(where: str, default: Any, value: Any) -> None:
    """The default's type is what ``fit()`` expects (``None`` defaults: anything)."""
    if default is None or default is inspect.Parameter.empty or value is None:
        return
    kind = type(default)
    if kind not in _EXPECTED:
        return
    ok = {
        bool: isinstance(value, bool) or value in (0, 1),
        # full_output=1, disp=1: integers used as flags
        int: isinstance(value, int | bool) if default in (0, 1) else _is_int(value),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[kind]
    if not ok:
        raise ConfigError(
            f"{where}: expected {_EXPECTED[kind]} (the default is {default!r}), "
            f"got {type(value).__name__}"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_trial_fit(spec: ModelSpec, prepared) -> None:
    """Fit one chunk with and without the options: an error only the options cause
    is theirs, and would repeat in every chunk."""
    if not spec.fit_options:
        return
    import dataclasses

    from .fit import fit_chunk

    with_options = fit_chunk(spec, prepared)
    if with_options.ok or with_options.error_type in _DATA_OUTCOMES:
        return
    without = fit_chunk(dataclasses.replace(spec, fit_options=()), prepared)
    if without.ok or without.error_type != with_options.error_type:
        options = ", ".join(f"{k}={v!r}" for k, v in spec.fit_options)
        raise ConfigError(
            f"fit_options ({options}): {_model_class(spec.model).__name__}.fit() fails with "
            f"them on the first chunk and not without them: {with_options.error_message}"
        )
