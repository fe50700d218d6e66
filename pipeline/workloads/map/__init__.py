"""The ``map`` workload: a user's own function called per point of a grid, per chunk
of a dataset or per file (:mod:`.workload`; its inputs :mod:`.inputs`, :mod:`.files`;
the rows it stores :mod:`.rows`; finding, shipping and seeding the user's code
:mod:`.usercode`)."""

from .usercode import unit_seed
from .workload import MapJob, MapWorkload, run_map

__all__ = ["MapJob", "MapWorkload", "run_map", "unit_seed"]
