"""The settings of a regression job, and their validation into a :class:`ModelSpec`.

List-valued settings (``chunk_by``, ``exog``) are comma-separated strings in flags
and environment variables (``--chunk-by ticker,date``); ``fit_options`` is a string
of ``key=value`` pairs (``maxiter=200,method=newton``), values parsed as Python
literals where they are one (numbers, true/false, None), else kept as strings.
A job file may give TOML lists and, for ``fit_options``, a TOML table, once
``config._coerce`` joins them into that same comma-separated string.
"""

from __future__ import annotations

import ast
import builtins
import functools
from dataclasses import dataclass, fields
from typing import Any

from ...config import check_settings, setting, split_list
from ...errors import ConfigError

__all__ = [
    "COV_TYPES",
    "ENGINES",
    "MODELS",
    "FormulaInfo",
    "ModelSpec",
    "RegressionJob",
    "analyze_formula",
    "eval_env",
    "model_desc",
    "parse_fit_options",
]

MODELS = ("ols", "wls", "glm", "logit", "probit", "poisson", "quantreg", "rlm")
COV_TYPES = ("nonrobust", "HC0", "HC1", "HC2", "HC3", "HAC", "cluster")
FAMILIES = {
    "gaussian": "Gaussian",
    "binomial": "Binomial",
    "poisson": "Poisson",
    "gamma": "Gamma",
    "inverse_gaussian": "InverseGaussian",
    "negative_binomial": "NegativeBinomial",
    "tweedie": "Tweedie",
}
LINKS = {
    "identity": "Identity",
    "log": "Log",
    "logit": "Logit",
    "probit": "Probit",
    "cloglog": "CLogLog",
    "loglog": "LogLog",
    "cauchy": "Cauchy",
    "inverse_power": "InversePower",
    "inverse_squared": "InverseSquared",
    "sqrt": "Sqrt",
}
NORMS = (
    "HuberT",
    "TukeyBiweight",
    "Hampel",
    "AndrewWave",
    "RamsayE",
    "TrimmedMean",
    "LeastSquares",
)
#: Models whose ``fit`` takes ``cov_type``; quantreg and rlm have their own covariance.
#: ``auto``: the batched engine wherever it applies (see :mod:`.engine`), else statsmodels.
ENGINES = ("auto", "statsmodels", "batched")
_COV_MODELS = {"ols", "wls", "glm", "logit", "probit", "poisson"}
_LINEAR = {"ols", "wls"}


def _listing(default, help: str):
    """A str setting that a job file may also give as a TOML list or table."""
    return setting(default, str, help, sequence=True)


@dataclass(frozen=True)
class RegressionJob:
    """The settings of a regression job (job-file keys, ``--flags``, ``PIPELINE_*`` vars)."""

    def __post_init__(self) -> None:
        check_settings(self)

    name: str | None = setting(
        None,
        str,
        "Job id: names the job's folder in the output. Default: the job file's name, or the "
        "workload's.",
    )
    data: str | None = setting(
        None, str, "Parquet dataset: one file, a folder, or an s3:// prefix of .parquet files."
    )
    model: str = setting("ols", str, "Model to fit per chunk.", choices=MODELS)
    formula: str | None = setting(
        None, str, "Model formula (patsy), e.g. 'y ~ x1 + np.log(x2) + C(sector)'."
    )
    endog: str | None = setting(None, str, "Response column (instead of --formula).")
    exog: str | None = _listing(None, "Regressor columns, comma-separated (instead of --formula).")
    add_constant: bool = setting(True, bool, "With --endog/--exog: add an intercept 'const'.")
    weights: str | None = setting(None, str, "Weights column (wls).")
    family: str = setting("gaussian", str, "GLM family.", choices=tuple(FAMILIES))
    link: str | None = setting(
        None, str, "GLM link (default: the family's canonical link).", choices=tuple(LINKS)
    )
    q: float = setting(0.5, float, "Quantile (quantreg).", minimum=0.0, below=1.0)
    norm: str = setting("HuberT", str, "Robust norm (rlm).", choices=NORMS)
    cov_type: str = setting("nonrobust", str, "Covariance of the estimates.", choices=COV_TYPES)
    maxlags: int | None = setting(None, int, "HAC lags (required with cov_type HAC).", minimum=0)
    cluster: str | None = setting(None, str, "Cluster column (required with cov_type cluster).")
    fit_options: str | None = _listing(
        None, "Options passed to fit(), e.g. 'maxiter=200,method=newton' (or a TOML table)."
    )
    alpha: float = setting(
        0.05, float, "Confidence intervals are 1 - alpha.", minimum=1e-9, below=1.0
    )
    chunk_by: str | None = _listing(
        None, "Column(s) whose values define the chunks, comma-separated (e.g. ticker,year)."
    )
    chunk_rows: int | None = setting(
        None, int, "Chunks of this many consecutive rows (instead of --chunk-by).", minimum=1
    )
    missing: str = setting(
        "drop",
        str,
        "Rows with NaN in a model variable: drop them (as statsmodels formulas do), or fail "
        "the chunk.",
        choices=("drop", "fail"),
    )
    engine: str = setting(
        "auto",
        str,
        "auto: the batched engine (numpy, many chunks at once) for the chunks it covers "
        "(ols and wls with nonrobust or HC0-HC3 covariances), statsmodels for the rest; "
        "statsmodels: statsmodels for every chunk; batched: as auto, for ols/wls jobs only. "
        "Results equal statsmodels' within 1e-8 relative.",
        choices=ENGINES,
    )
    plots: bool = setting(
        False, bool, "Write a diagnostic PDF per chunk and a summary figure of the coefficients."
    )


def parse_fit_options(text: str | None) -> dict[str, Any]:
    """``"maxiter=200,method=newton,disp=false"`` -> ``{"maxiter": 200, "method": ...}``."""
    out: dict[str, Any] = {}
    for part in split_list(text):
        key, sep, raw = part.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key.isidentifier():
            raise ConfigError(
                f"fit_options: {part!r} is not key=value (e.g. 'maxiter=200,method=newton')"
            )
        lowered = raw.lower()
        if lowered in {"true", "false"}:
            out[key] = lowered == "true"
        elif lowered in {"none", "null"}:
            out[key] = None
        else:
            try:
                out[key] = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                out[key] = raw
    return out


@dataclass(frozen=True)
class ModelSpec:
    """A validated model: everything a worker needs to fit one chunk (small, picklable)."""

    model: str
    formula: str | None
    endog: str | None
    exog: tuple[str, ...]
    add_constant: bool
    weights: str | None
    family: str
    link: str | None
    q: float
    norm: str
    cov_type: str
    maxlags: int | None
    cluster: str | None
    fit_options: tuple[tuple[str, Any], ...]
    alpha: float
    missing: str
    engine: str

    @property
    def linear(self) -> bool:
        return self.model in _LINEAR

    @classmethod
    def from_job(cls, job: RegressionJob) -> ModelSpec:
        if job.model not in MODELS:
            raise ConfigError(f"model {job.model!r} is not one of {', '.join(MODELS)}")
        if job.cov_type not in COV_TYPES:
            raise ConfigError(f"cov_type {job.cov_type!r} is not one of {', '.join(COV_TYPES)}")
        exog = split_list(job.exog)
        if job.formula and (job.endog or exog):
            raise ConfigError("give either formula, or endog and exog, not both")
        if not job.formula and not (job.endog and exog):
            raise ConfigError(
                "no model variables: give formula (e.g. 'y ~ x1 + x2') or endog and exog"
            )
        if job.model == "wls" and not job.weights:
            raise ConfigError("model wls needs weights = the weights column")
        if job.weights and job.model != "wls":
            raise ConfigError(f"weights applies to model wls, not {job.model}")
        if job.model != "glm" and (job.link is not None or job.family != "gaussian"):
            raise ConfigError(f"family and link apply to model glm, not {job.model}")
        if job.model == "quantreg" and not 0.0 < job.q < 1.0:
            raise ConfigError(f"q must be between 0 and 1 (exclusive), got {job.q}")
        if job.cov_type != "nonrobust" and job.model not in _COV_MODELS:
            raise ConfigError(
                f"cov_type {job.cov_type}: model {job.model} computes its own covariance "
                "(use fit_options, e.g. vcov=iid for quantreg or cov=H2 for rlm)"
            )
        if job.cov_type == "HAC" and job.maxlags is None:
            raise ConfigError("cov_type HAC needs maxlags")
        if job.cov_type == "cluster" and not job.cluster:
            raise ConfigError("cov_type cluster needs cluster = the column to cluster by")
        if job.cluster and job.cov_type != "cluster":
            raise ConfigError(f"cluster applies to cov_type cluster, not {job.cov_type}")
        # Set where they do nothing, they were ignored: --maxlags 5 gave nonrobust errors
        if job.maxlags is not None and job.cov_type != "HAC":
            raise ConfigError(f"maxlags applies to cov_type HAC, not {job.cov_type}")
        unset = {f.name: f.default for f in fields(job)}
        if job.q != unset["q"] and job.model != "quantreg":
            raise ConfigError(f"q applies to model quantreg, not {job.model}")
        if job.norm != unset["norm"] and job.model != "rlm":
            raise ConfigError(f"norm applies to model rlm, not {job.model}")
        if job.engine == "batched" and job.model not in ("ols", "wls"):
            raise ConfigError(f"engine batched fits ols and wls only, not {job.model}")
        if not 0.0 < job.alpha < 1.0:
            raise ConfigError(f"alpha must be between 0 and 1, got {job.alpha}")
        options = parse_fit_options(job.fit_options)
        reserved = {"cov_type", "cov_kwds", "q"} & set(options)
        if reserved:
            raise ConfigError(
                f"fit_options: {', '.join(sorted(reserved))} are set by their own settings "
                "(cov_type, maxlags, cluster, q)"
            )
        if job.engine == "batched" and options:
            # The batched engine has one method of its own; an option it cannot apply
            # would be dropped without a word (statsmodels applies them: engine auto).
            given = ", ".join(f"{k}={v!r}" for k, v in options.items())
            raise ConfigError(
                f"engine batched applies no fit_options ({given}): it fits by its own "
                "method (QR of the column-scaled design); use engine auto or statsmodels, "
                "which fit these chunks with statsmodels and the options"
            )
        return cls(
            model=job.model,
            formula=job.formula,
            endog=job.endog,
            exog=exog,
            add_constant=job.add_constant,
            weights=job.weights,
            family=job.family,
            link=job.link,
            q=job.q,
            norm=job.norm,
            cov_type=job.cov_type,
            maxlags=job.maxlags,
            cluster=job.cluster,
            fit_options=tuple(sorted(options.items())),
            alpha=job.alpha,
            missing=job.missing,
            engine=job.engine,
        )

    def extra_columns(self) -> tuple[str, ...]:
        """Columns besides the formula's variables: weights and cluster groups."""
        return tuple(c for c in (self.weights, self.cluster) if c)


# -- formulas ----------------------------------------------------------------------------

#: patsy transforms whose result depends on the data they were first built on: a
#: design built once and reused would differ from one built on each chunk.
_STATEFUL = {"center", "standardize", "scale", "bs", "cr", "cc", "te"}
_CONTRASTS = {"Treatment", "Poly", "Sum", "Helmert", "Diff", "ContrastMatrix"}
_MODULES = {"np": "numpy", "numpy": "numpy"}


def eval_env():
    """The names a formula may use besides columns: ``np``/``numpy`` (patsy adds its own)."""
    import numpy
    import patsy

    return patsy.EvalEnvironment([{"np": numpy, "numpy": numpy}])


@functools.lru_cache(maxsize=16)
def model_desc(formula: str):
    """The parsed formula (``patsy.ModelDesc``), once per process."""
    import patsy

    try:
        return patsy.ModelDesc.from_formula(formula)
    except patsy.PatsyError as exc:
        raise ConfigError(
            f"formula {formula!r} does not parse: {exc}\n(a column whose name has spaces or "
            'symbols, such as x-2, is written Q("x-2"))'
        ) from None


@dataclass(frozen=True)
class FormulaInfo:
    columns: tuple[str, ...]  # dataset columns the formula reads, in order of appearance
    exact_only: bool  # stateful transforms: build the design per chunk
    has_intercept: bool
    #: Explicit contrasts or levels (``C(g, Sum)``, ``Treatment('C')``): a chunk lacking
    #: some of its task's levels is designed alone (its coding is no column subset).
    explicit_contrasts: bool = False


def analyze_formula(formula: str) -> FormulaInfo:
    """The columns a formula reads and whether its design may be built once per task."""
    import patsy.builtins

    desc = model_desc(formula)
    if not desc.lhs_termlist:
        raise ConfigError(f"formula {formula!r} has no response (expected 'y ~ x1 + ...')")
    known = set(patsy.builtins.__all__) | set(_MODULES) | set(dir(builtins))
    columns: dict[str, None] = {}
    exact = contrasts = False
    for term in [*desc.lhs_termlist, *desc.rhs_termlist]:
        for factor in term.factors:
            code = getattr(factor, "code", None)
            if code is None:
                exact = True
                continue
            try:
                tree = ast.parse(code, mode="eval")
            except SyntaxError as exc:
                raise ConfigError(
                    f"formula {formula!r}: {code!r} is not valid: {exc} (a column whose name "
                    f"has spaces or symbols is written Q({code.strip()!r}))"
                ) from None
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id not in known
                ):
                    raise ConfigError(
                        f"formula {formula!r}: {node.func.id}() is not a function a formula "
                        "knows; it has numpy as np (np.log), Python's builtins and patsy's "
                        "(C, I, Q, center, standardize, bs, cr, cc, te)"
                    )
                if isinstance(node, ast.Name) and node.id not in known:
                    columns[node.id] = None
                elif isinstance(node, ast.Name) and node.id in _STATEFUL:
                    exact = True
                elif isinstance(node, ast.Name) and node.id in _CONTRASTS:
                    contrasts = True
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    if node.func.id == "Q" and node.args and isinstance(node.args[0], ast.Constant):
                        columns[str(node.args[0].value)] = None
                    if node.func.id == "C" and (len(node.args) > 1 or node.keywords):
                        contrasts = True
    has_intercept = any(not t.factors for t in desc.rhs_termlist)
    return FormulaInfo(tuple(columns), exact, has_intercept, contrasts)
