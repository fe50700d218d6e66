"""A job's planned tasks go to the cluster as joblib calls on the ``pipeline`` backend:
joblib's own settings in effect (``parallel_config(verbose=...)``) see them."""

from __future__ import annotations

import re

import joblib
from support.workloads import SquaresWorkload

from pipeline import RunOptions, run_job


def test_a_jobs_tasks_are_joblib_calls_on_the_pipeline_backend(tmp_path, client, capfd):
    # joblib's Parallel reports its backend and its calls on stderr under verbose: the
    # job's 4 tasks (12 units, 3 a task) are 4 calls of one Parallel on PipelineBackend.
    options = RunOptions(output=str(tmp_path), progress=False, units_per_task=3)
    with joblib.parallel_config(verbose=11):
        summary = run_job(SquaresWorkload("sq", 12), options, client, echo=lambda m: None)
    assert summary.complete and summary.units_run == 12
    told = capfd.readouterr().err
    assert "Using backend PipelineBackend" in told
    assert re.search(r"Done +4 out of +4 .*finished", told)
