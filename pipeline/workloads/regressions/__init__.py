"""Per-chunk regression engines."""

from .generate import regression_formula, true_coefficients, write_regression_data
from .spec import ModelSpec, RegressionJob
from .workload import RegressionWorkload

__all__ = [
    "ModelSpec",
    "RegressionJob",
    "RegressionWorkload",
    "regression_formula",
    "true_coefficients",
    "write_regression_data",
]
