"""Map jobs for the tests: the test functions' module (tests/mapfns/userfns.py) and a
run of a grid on a client."""

from __future__ import annotations

from pathlib import Path

from pipeline import MapJob, MapWorkload, RunOptions, run_job

FN = "mapfns.userfns"


def run(client, out, job_id="m", units_per_task=2, echo=None, **settings):
    """A map job of ``settings`` run on ``client`` into ``out`` (a grid file's copy
    under it); the run's summary."""
    w = MapWorkload(MapJob(**settings), job_id, output=str(out))
    options = RunOptions(output=str(out), units_per_task=units_per_task, progress=False)
    return run_job(w, options, client, echo=echo or (lambda m: None))


GATED_CODE = Path(__file__).parents[1] / "mapfns" / "gated.py"


def gated_job(folder: Path, grid: str, gate: Path, log: Path) -> Path:
    """A job file in ``folder`` mapping ``mapfns/gated.py``'s ``unit`` over ``grid``
    (TOML lines of the grid's axes besides ``gate`` and ``log``)."""
    path = folder / "gated.toml"
    path.write_text(
        f'workload = "map"\nfunction = "gated:unit"\ncode = "{GATED_CODE}"\n'
        f'[grid]\n{grid}\ngate = ["{gate}"]\nlog = ["{log}"]\n'
    )
    return path
