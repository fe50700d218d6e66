"""One job's run on the driver: its output opened and locked (:mod:`.output`), its
plan, the tasks not yet complete run, the job finalized and summarized (:mod:`.run`)."""

from .output import check_batch_space, only_finalization_left, open_output
from .run import WAIT_FOR_WORKERS, completed_job, run_job, run_validated_job

__all__ = [
    "WAIT_FOR_WORKERS",
    "check_batch_space",
    "completed_job",
    "only_finalization_left",
    "open_output",
    "run_job",
    "run_validated_job",
]
