"""How the ``pipeline`` joblib backend hands its batches to the scheduler (issue 45.3's
fleet bar: scheduler CPU per call): receipts that came together are taken together,
so the batches their callbacks dispatch go in one submission; calls defined in
``__main__`` travel in tasks Dask pickles with the standard pickler; on many workers
auto batching aims at the planner's scheduler floor."""

from __future__ import annotations

import pickle

from distributed.protocol import pickle as dask_pickle
from joblib import Parallel
from support.call_tasks import call_task
from support.waiting import wait_for

from pipeline.joblib import PipelineBackend
from pipeline.joblib.call_runner import CallRunner
from pipeline.joblib.calls import CallBatch, CallsWorkload, CallTask, pickle_batch
from pipeline.joblib.session import CallJob


def square(x):
    return x * x


def test_receipts_that_came_together_come_out_of_one_poll():
    # One poll, every receipt waiting: the session then submits the batches their
    # callbacks dispatched in one Client.map (it took one receipt a poll: one
    # message to the scheduler per call).
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=2, processes=False,
                     dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        runner = CallRunner(CallsWorkload(job_id="joblib-submission"), client)
        try:
            runner.add([call_task(i, square, i) for i in range(8)])
            # (the receipts, each an event, wait in the runner's inbox)
            wait_for("8 receipts in the inbox", lambda: runner._inbox.qsize() >= 8, timeout=60)
            receipts = runner.poll()
            assert sorted(r.index for r in receipts) == list(range(8))
            assert runner.pending == 0
        finally:
            runner.close()


def test_calls_defined_in_main_travel_in_a_task_the_standard_pickler_takes():
    def triple(x):
        return 3 * x

    triple.__module__ = "__main__"  # (as a script's function: cloudpickle sends it by value)
    nested = PipelineBackend(nesting_level=0).get_nested_backend()
    payload = pickle_batch(CallBatch([(triple, (2,), {})], nested))
    assert b"__main__" in payload
    task = CallTask.inline(0, 0, 1, payload)
    data = pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL)
    assert b"__main__" not in data
    # Dask's pickling of the task (the scheduler's, each time it sends it to a worker)
    # is the standard pickler's, not cloudpickle's.
    assert dask_pickle.dumps(task) == data
    assert pickle.loads(data).batch().run() == [6]


def _completed(backend: PipelineBackend, ran_seconds: float, waited_seconds: float) -> None:
    """A one-call batch whose task ran ``ran_seconds`` on its worker, its outcome in
    ``waited_seconds`` after its dispatch, as joblib reports it."""
    job = CallJob(0, 1, None, None)
    job.outcome, job.seconds = ("ok", [1]), ran_seconds
    assert backend.retrieve_result_callback(job) == [1]
    backend.batch_completed(1, waited_seconds)


def test_auto_batching_on_many_workers_aims_at_the_scheduler_floor():
    # 1,000 batches at once, a task each: batches of at least 4 s keep the scheduler
    # under a quarter of its core at 1 ms a task. A 2-s call that waited 5 s behind
    # the batches dispatched ahead of it: batches of two.
    backend = PipelineBackend()
    assert backend.configure(n_jobs=1000, parallel=Parallel(verbose=0)) == 1000
    assert round(backend.MIN_IDEAL_BATCH_DURATION, 6) == 4.0
    _completed(backend, ran_seconds=2.0, waited_seconds=5.0)
    assert backend.compute_batch_size() == 2


def test_auto_batching_on_few_workers_is_joblibs():
    # joblib's thresholds, on joblib's own measure (dispatch to outcome).
    backend = PipelineBackend()
    backend.configure(n_jobs=4, parallel=Parallel(verbose=0))
    assert round(backend.MIN_IDEAL_BATCH_DURATION, 6) == 0.2
    _completed(backend, ran_seconds=2.0, waited_seconds=0.05)
    assert backend.compute_batch_size() == 2
