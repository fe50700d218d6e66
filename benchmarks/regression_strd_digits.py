"""Correct digits on NIST's StRD linear regression sets (tests/data/strd): the table of
docs/regressions.md.

For each set: statsmodels' ``OLS(y, X).fit()`` on the certified model's design, and the
regressions workload with each engine (``auto``, ``batched``, ``statsmodels``; OLS, and
with ``--wls`` WLS on the rows scaled by 2**-m with weights 4**m, which has the same
certified values), each chunk fitted in process as a task fits it (``fit_range``), as
tests/test_strd.py does. A score is the worst estimate's / worst standard error's
correct digits (-log10 of the relative error; of the absolute error for a certified 0),
capped at 15; the engines' ``method`` column and the path of the batched engine's
solve (Cholesky QR or Householder QR) are shown beside them.

    python -m benchmarks.regression_strd_digits [--wls]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np

from harness.strd import (
    SETS,
    design,
    digits,
    fitted,
    frame,
    settings,
    statsmodels_digits,
    write,
)
from pipeline.workloads.regressions import estimates
from pipeline.workloads.regressions.batched import Unsupported, fit_ols_batch

ENGINES = ("auto", "batched", "statsmodels")


def score(pair) -> str:
    """Worst estimate / worst standard error, in correct digits (at most 15)."""
    b, s = (round(min(float(np.min(a)), 15.0), 1) + 0.0 for a in pair)  # + 0.0: no -0.0
    return f"{b:.1f} / {s:.1f}"


def how(engine: str, method: str, on_gram: bool) -> str:
    """What fitted the set: the statsmodels engine, Cholesky QR, refined."""
    said = ["statsmodels engine"] if engine == "statsmodels" else []
    said += ["Cholesky QR"] if engine == "batched" and on_gram else []
    said += ["refined"] if method.endswith("+refined") else []
    return f" ({', '.join(said)})" if said else ""


def on_gram(X: np.ndarray, y: np.ndarray) -> bool:
    """Whether the batched engine's solve takes Cholesky QR for this design."""
    e = estimates.solve(X[None], y[None], "nonrobust", float(len(y) - X.shape[1]))
    return bool(e.on_gram[0])


def vander_design(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The certified model's design (np.vander: the WLS rows, whitened, are these)."""
    return design(name), np.asarray(SETS[name]["y"], dtype=float)


def formula_design(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The design the OLS job's formula builds (``I(x**j)``: np.power, not np.vander's
    products, so its last bits may differ)."""
    import patsy

    y, X = patsy.dmatrices(settings(name)["formula"], frame(name), return_type="matrix")
    return np.asarray(X), np.asarray(y)[:, 0]


def workload_cell(data: str, name: str, engine: str, wls: bool) -> str:
    coefs, models = fitted(data, name, engine, wls)
    if models.error_type.notna().any():
        return str(models.error_type.iloc[0])
    gram = on_gram(*formula_design(name)) if not wls else on_gram(*vander_design(name))
    return score(digits(name, coefs.estimate, coefs.std_error)) + how(
        models.engine.iloc[0], models.method.iloc[0], gram
    )


def vander_cell(name: str) -> str:
    """The batched engine in process on the certified model's design (np.vander)."""
    X, y = vander_design(name)
    (r,) = fit_ols_batch([X], [y], has_constant=not name.startswith("NoInt"))
    if isinstance(r, Unsupported):
        return f"handed back: {r.reason}"
    return score(digits(name, r.params, r.bse)) + how(
        "batched", "qr+refined" if r.refined else "qr", on_gram(X, y)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wls", action="store_true", help="WLS on the scaled rows, not OLS")
    args = ap.parse_args()
    heads = ["set", "statsmodels' `OLS.fit()`", *(f"engine {e}" for e in ENGINES),
             "batched engine on `np.vander`, in process"]  # fmt: skip
    print("| " + " | ".join(heads) + " |")
    print("|" + " --- |" * len(heads))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(SETS):
            data = write(frame(name, args.wls), Path(tmp) / name)
            cells = [name, score(statsmodels_digits(name))]
            cells += [workload_cell(data, name, e, args.wls) for e in ENGINES]
            cells.append(vander_cell(name))
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
