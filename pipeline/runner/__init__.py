"""One job's run on the driver: its output opened and locked (:mod:`.output`), the run
object that takes it through its phases (:mod:`.run`), its summary from the tasks'
receipts (:mod:`.summarize`), and the entry points (:mod:`.job`)."""

from .job import completed_job, run_job, run_validated_job
from .output import check_batch_space, only_finalization_left, open_output
from .run import WAIT_FOR_WORKERS, JobRun

__all__ = [
    "WAIT_FOR_WORKERS",
    "JobRun",
    "check_batch_space",
    "completed_job",
    "only_finalization_left",
    "open_output",
    "run_job",
    "run_validated_job",
]
