"""Per-chunk regression engines."""

from .generate import regression_formula, true_coefficients, write_regression_data
from .results import results_table, summarize, write_results
from .spec import ModelSpec, RegressionJob
from .workload import RegressionWorkload

__all__ = [
    "ModelSpec",
    "RegressionJob",
    "RegressionWorkload",
    "regression_formula",
    "results_table",
    "summarize",
    "true_coefficients",
    "write_regression_data",
    "write_results",
]
