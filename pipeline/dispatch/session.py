"""The driver's session with the scheduler: how promptly it sends, and the Ctrl-C that
ends its wait. (How long it waits to reconnect, and the tasks a killed driver left,
are the lease's: :mod:`.lease`.)"""

from __future__ import annotations

import threading

__all__ = ["INTERRUPTED", "send_promptly"]

#: Set by a Ctrl-C (the command line's handler): the runner's wait raises it again.
INTERRUPTED = threading.Event()
#: Seconds between the client's batches of messages to the scheduler (Dask's: 10 ms).
SEND_INTERVAL = 0.001


def send_promptly(client) -> None:
    """Have ``client`` send its messages to the scheduler at most 1 ms apart. Dask's
    client batches them 10 ms apart, and a probe round is submitted just after the
    last round's receipts came: its tasks would wait for the next batch, a delay as
    long as a short probe itself. A reconnected client is back at Dask's interval."""
    stream = getattr(client, "scheduler_comm", None)
    if isinstance(getattr(stream, "interval", None), float):
        stream.interval = min(stream.interval, SEND_INTERVAL)
