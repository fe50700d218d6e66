"""Map jobs for the tests: the test functions' module (tests/mapfns/userfns.py) and a
run of a grid on a client."""

from __future__ import annotations

from pipeline import MapJob, MapWorkload, RunOptions, run_job

FN = "mapfns.userfns"


def run(client, out, job_id="m", units_per_task=2, echo=None, **settings):
    """A map job of ``settings`` run on ``client`` into ``out`` (a grid file's copy
    under it); the run's summary."""
    w = MapWorkload(MapJob(**settings), job_id, output=str(out))
    options = RunOptions(output=str(out), units_per_task=units_per_task, progress=False)
    return run_job(w, options, client, echo=echo or (lambda m: None))
