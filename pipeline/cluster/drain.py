"""Dask nanny preload (``distributed.nanny.preload``): a worker asked to leave drains.

``dask worker`` answers SIGTERM (a spot instance's interruption notice, an
autoscaler's scale-in, ``docker stop``) by closing its nannies, which kill their
worker processes: a task running there was run again elsewhere, and one whose
result was not yet reported was computed twice. With this preload, a closing nanny
first has its worker take no new task, waits (at most ``PIPELINE_DRAIN_SECONDS``)
for the tasks it is running to finish, and retires it from the scheduler, which
keeps what it finished; only then is the worker process stopped. The tasks it had
queued and not started go to other workers at once.

The Docker image, the Compose file and the Terraform module's workers load it
(``DASK_DISTRIBUTED__NANNY__PRELOAD``); give ``docker stop`` (or systemd) a timeout
above the drain's.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time

__all__ = ["dask_teardown", "drain"]

log = logging.getLogger(__name__)

#: Seconds between looks at the worker's running tasks.
POLL_SECONDS = 0.25


def _stop_taking(dask_worker) -> int:
    """Worker: start no new task from now on; the count of tasks running.

    The worker is paused (the scheduler sends a paused worker no task, and the worker
    starts none of those it queued), and its memory monitor stops pausing and
    unpausing it: with a memory limit set (``dask worker``'s default) the monitor
    sets any paused worker below its pause fraction running again within 100 ms."""
    from distributed.core import Status

    memory = getattr(dask_worker, "memory_manager", None)
    if memory is not None:
        memory.memory_pause_fraction = False
    if dask_worker.status == Status.running:
        dask_worker.status = Status.paused
    return _running(dask_worker)


def _running(dask_worker) -> int:
    """Worker: the count of tasks running, once the tasks queued here and not started
    are handed back to the scheduler, which sends them to other workers at once (and
    has this one forget them) rather than when this one is retired."""
    stimulus_id = f"pipeline-drain-{time.time()}"
    for ts in list(dask_worker.state.ready):
        dask_worker.batched_send({"op": "reschedule", "key": ts.key, "stimulus_id": stimulus_id})
    return len(dask_worker.state.executing)


async def _on_worker(nanny, function) -> int:
    reply = await nanny.rpc(nanny.worker_address).run(function=pickle.dumps(function))
    if reply.get("status") != "OK":
        raise RuntimeError(f"{reply.get('exception')!r}")
    return int(reply["result"])


async def drain(nanny, seconds: float) -> None:
    """Have ``nanny``'s worker finish what it runs (at most ``seconds``), then retire it."""
    address = nanny.worker_address
    if not address or nanny.process is None:
        return
    deadline = time.monotonic() + seconds
    try:
        running = await _on_worker(nanny, _stop_taking)
        if running:
            log.info("worker %s: draining %d running task(s), up to %g s", address,
                     running, seconds)  # fmt: skip
        while running and time.monotonic() < deadline:
            await asyncio.sleep(POLL_SECONDS)
            running = await _on_worker(nanny, _running)
        if running:
            log.warning("worker %s: %d task(s) still running after %g s; stopping it",
                        address, running, seconds)  # fmt: skip
        await nanny.scheduler.retire_workers(
            workers=[address],
            close_workers=False,
            remove=True,
            stimulus_id=f"pipeline-drain-{time.time()}",
        )
    except Exception as exc:  # the worker or the scheduler gone already: nothing to drain
        log.info("worker %s: not drained (%s: %s)", address, type(exc).__name__, exc)


async def dask_teardown(nanny) -> None:
    from ..config import process_settings

    await drain(nanny, process_settings().drain_seconds)
