"""A map function held by a test's gate, for tests that stop, kill or cut a run while
its units are running.

``unit(x, gate, log, free_below=0)`` appends its process id to ``LOG/started-X`` as it
starts and to ``LOG/ended-X`` as it returns; a unit with ``x >= free_below`` waits until
the file ``gate`` exists (at most two minutes: a test that never opens it still ends).
"""

import os
import time


def unit(x, gate, log, free_below=0):
    with open(os.path.join(log, f"started-{x}"), "a") as f:
        f.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + 120
    while x >= free_below and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(os.path.join(log, f"ended-{x}"), "a") as f:
        f.write(f"{os.getpid()}\n")
    return {"y": 2 * x}
