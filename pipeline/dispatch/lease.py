"""A run's tasks outlive a lost connection to its driver for a while, not for ever.

A scheduler forgets every task a client wanted the moment the client's connection
closes, as it does when a load balancer fails over: the tasks queued are dropped and
those running are done for nothing. So the runner has each of its tasks wanted also
by a holder, a name the scheduler keeps for the driver's client
(``pipeline-holder-<client id>``), and lets go of a task's hold when its receipt
comes (or when it submits the task again under a new key). :class:`RunLease`, a
scheduler plug-in, lets go of the holder's tasks once the driver has been gone for
its own ``grace`` seconds (its client reconnects within its own connect timeout,
shorter), and unregisters the worker plug-ins registered for it (a shipped
workload); a rerun of the job lets go of them as it starts (:func:`release_job`): a
driver that was killed leaves no tasks running on, and nothing sent to the workers
that join later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from distributed.diagnostics.plugin import SchedulerPlugin

from ..cluster.connect import connect_seconds
from ..workload import Workload

__all__ = [
    "RunLease",
    "ensure_lease",
    "hold",
    "holder_of",
    "job_prefix",
    "own_plugin",
    "reconnect_seconds",
    "release",
    "release_job",
    "release_left_tasks",
]

log = logging.getLogger(__name__)

PLUGIN_NAME = "pipeline-run-lease"
HOLDER_PREFIX = "pipeline-holder-"
#: The scheduler's handler a driver calls to let go of a job's tasks left held.
RELEASE_HANDLER = "pipeline_release_prefix"
#: The scheduler's handler a driver calls to have its tasks held, with its grace.
HOLD_HANDLER = "pipeline_lease_hold"
#: The scheduler's handler a driver calls to have a worker plug-in of its unregistered
#: when its lease expires.
PLUGINS_HANDLER = "pipeline_lease_plugin"


def holder_of(client_id: str) -> str:
    """The name holding a client's tasks on the scheduler."""
    return f"{HOLDER_PREFIX}{client_id}"


class RunLease(SchedulerPlugin):
    """Scheduler: release a driver's held tasks, and unregister the worker plug-ins
    registered for it, its own ``grace`` seconds after it left, unless it came back."""

    name = PLUGIN_NAME
    #: One per scheduler: a later run's registration keeps the one running (and its
    #: pending releases); each driver gives its own grace (:data:`HOLD_HANDLER`).
    idempotent = True

    def __init__(self):
        #: A driver's grace, by its client id.
        self._graces: dict[str, float] = {}
        #: The worker plug-ins registered for a driver, by its client id.
        self._plugins: dict[str, set[str]] = {}
        self._pending: dict[str, asyncio.TimerHandle] = {}
        self._unregistering: set[asyncio.Future] = set()
        self._scheduler = None

    async def start(self, scheduler) -> None:
        self._scheduler = scheduler
        scheduler.handlers[RELEASE_HANDLER] = self.release_prefix
        scheduler.handlers[HOLD_HANDLER] = self.hold
        scheduler.handlers[PLUGINS_HANDLER] = self.own_plugin

    def hold(self, client: str, grace: float) -> str:
        """Hold ``client``'s tasks for ``grace`` seconds after it leaves (from now, and
        anew after a reconnection); the holder's name."""
        holder = holder_of(client)
        self._graces[client] = float(grace)
        self._scheduler.client_desires_keys(keys=[], client=holder)  # the holder exists
        return holder

    def own_plugin(self, client: str, name: str) -> None:
        """Unregister worker plug-in ``name`` when ``client``'s lease expires."""
        self._plugins.setdefault(client, set()).add(name)

    def release_prefix(self, prefix: str) -> int:
        """Let go of every held task whose key starts with ``prefix`` (a job's tasks left
        by a driver that is gone); how many."""
        released = 0
        for name, held in list(self._scheduler.clients.items()):
            if not name.startswith(HOLDER_PREFIX):
                continue
            keys = [ts.key for ts in held.wants_what if str(ts.key).startswith(prefix)]
            if keys:
                self._scheduler.client_releases_keys(
                    keys=keys, client=name, stimulus_id=f"pipeline-job-rerun-{time.time()}"
                )
                released += len(keys)
        if released:
            log.info("released %d held tasks of %s (a rerun of their job)", released, prefix)
        return released

    def add_client(self, scheduler, client: str) -> None:
        handle = self._pending.pop(client, None)
        if handle is not None:
            handle.cancel()

    def remove_client(self, scheduler, client: str) -> None:
        grace = self._graces.get(client)
        if grace is None or client in self._pending:
            return
        loop = asyncio.get_running_loop()
        self._pending[client] = loop.call_later(grace, self._release, scheduler, client)

    def _release(self, scheduler, client: str) -> None:
        self._pending.pop(client, None)
        grace = self._graces.pop(client, 0.0)
        holder = holder_of(client)
        held = scheduler.clients.get(holder)
        keys = [ts.key for ts in held.wants_what] if held is not None else []
        if keys:
            log.warning("client %s gone for %g s: releasing the %d tasks it held", client,
                        grace, len(keys))  # fmt: skip
            scheduler.client_releases_keys(
                keys=keys, client=holder, stimulus_id=f"pipeline-lease-expired-{time.time()}"
            )
        scheduler.clients.pop(holder, None)
        plugins = [p for p in self._plugins.pop(client, ()) if p in scheduler.worker_plugins]
        for name in plugins:
            log.warning("client %s gone for %g s: unregistering worker plug-in %s", client,
                        grace, name)  # fmt: skip
            task = asyncio.ensure_future(_unregister(scheduler, name))
            self._unregistering.add(task)
            task.add_done_callback(self._unregistering.discard)

    async def close(self) -> None:
        for handle in self._pending.values():
            with contextlib.suppress(Exception):
                handle.cancel()
        self._pending.clear()


async def _unregister(scheduler, name: str) -> None:
    """Scheduler: unregister worker plug-in ``name`` from it and every worker (nothing if
    it went meanwhile)."""
    with contextlib.suppress(Exception):
        await scheduler.unregister_worker_plugin(comm=None, name=name)


def ensure_lease(client, grace: float, *, again: bool = False) -> str | None:
    """The holder of ``client``'s tasks, released ``grace`` seconds after the client
    left (this driver's own grace), once the scheduler runs :class:`RunLease`; None
    (tasks not held) where the scheduler cannot run it (this package is not installed
    where it runs). ``again``: registered anew (a client reconnected, maybe to a new
    scheduler behind the same address: the plug-in and the holder are made there)."""
    if again or getattr(client, "_pipeline_lease", None) is None:
        try:
            client.register_plugin(RunLease(), name=PLUGIN_NAME)
            holder = client.sync(getattr(client.scheduler, HOLD_HANDLER),
                                 client=client.id, grace=grace)  # fmt: skip
            client._pipeline_lease = holder
        except Exception as exc:
            log.warning(
                "the scheduler cannot hold this run's tasks while its connection to the "
                "driver is down (%s: %s): a lost connection drops its queued tasks, which "
                "the run then submits again", type(exc).__name__, exc,
            )  # fmt: skip
            client._pipeline_lease = ""
    return client._pipeline_lease or None


def own_plugin(client, name: str) -> None:
    """Have worker plug-in ``name`` (registered for this driver) unregistered when the
    driver's lease expires: a killed driver's plug-ins are not sent to every worker
    that joins for ever. Nothing where the scheduler holds no lease for it."""
    if getattr(client, "_pipeline_lease", None):
        with contextlib.suppress(Exception):
            client.sync(getattr(client.scheduler, PLUGINS_HANDLER), client=client.id, name=name)


def release_job(client, prefix: str) -> None:
    """Let go of the held tasks of a job (keys starting with ``prefix``) that a driver
    killed left running: its rerun, about to start, runs what they did not finish. The
    tasks already running finish; none queued starts."""
    if not getattr(client, "_pipeline_lease", None):
        return
    with contextlib.suppress(Exception):
        client.sync(getattr(client.scheduler, RELEASE_HANDLER), prefix=prefix)


def hold(client, holder: str | None, keys: list) -> None:
    """Have ``holder`` want ``keys`` too (one message)."""
    if holder and keys:
        client._send_to_scheduler({"op": "client-desires-keys", "keys": keys, "client": holder})


def release(client, holder: str | None, keys: list) -> None:
    """Let go of ``holder``'s want of ``keys`` (one message)."""
    if holder and keys and client.status == "running":
        client._send_to_scheduler({"op": "client-releases-keys", "keys": keys, "client": holder})


def job_prefix(workload: Workload, output_url: str | None) -> str:
    """The start of the keys of a job's tasks on the scheduler: the job and its output."""
    import xxhash

    where = f"{output_url or ''}/{workload.job_id}"
    return f"pipeline-{workload.kind}-{xxhash.xxh3_64_hexdigest(where.encode())[:12]}-"


def release_left_tasks(client, workload: Workload, output_url: str) -> None:
    """Before a run of a job that writes its output (it holds the job's lock, so any
    driver that ran it before is gone): the tasks such a driver left held on the
    scheduler start no more (:func:`release_job`)."""
    ensure_lease(client, reconnect_seconds(client) + 10.0)
    release_job(client, job_prefix(workload, output_url))


def reconnect_seconds(client) -> float:
    """How long the client itself tries to reconnect (its ``timeout``), and a little:
    it says so by closing."""
    timeout = getattr(client, "_timeout", None)
    return (float(timeout) if timeout else connect_seconds()) + 5.0
