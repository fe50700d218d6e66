"""The ``map`` workload: a user's own function called per point of a grid, per chunk
of a dataset or per file (:mod:`.workload`; its settings :mod:`.job`; its inputs
:mod:`.grid`, :mod:`.inputs`, :mod:`.files`; a task on a worker :mod:`.task`; the rows
it stores :mod:`.rows`; finding, shipping and seeding the user's code :mod:`.usercode`;
``pipeline.map`` :mod:`.api`)."""

from .api import map_job
from .usercode import unit_seed
from .workload import MapJob, MapWorkload

__all__ = ["MapJob", "MapWorkload", "map_job", "unit_seed"]
