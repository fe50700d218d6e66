"""Map jobs for the tests: the test functions' module (tests/mapfns/userfns.py) and a
run of a grid on a client."""

from __future__ import annotations

from pipeline import MapJob, MapWorkload, RunOptions, run_job

FN = "mapfns.userfns"


def run(client, out, job_id="m", units_per_task=2, echo=None, **settings):
    w = MapWorkload(MapJob(**settings), job_id)
    options = RunOptions(output=str(out), units_per_task=units_per_task, progress=False)
    return run_job(w, options, client, echo=echo or (lambda m: None))
