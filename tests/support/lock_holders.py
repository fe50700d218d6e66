"""A job's lock held by another process, as a user's second run would hold it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

from pipeline.layout import lock_key


@contextlib.contextmanager
def lock_held_elsewhere(output: str, job_id: str, owner: str) -> Iterator[subprocess.Popen]:
    """A process holding ``job_id``'s lock under ``output`` (a folder or s3:// URL);
    killed with SIGKILL on leaving, if the test has not killed it already."""
    code = (
        "import time\nfrom pipeline.storage import open_store\n"
        f"with open_store({output!r}).hold({lock_key(job_id)!r}, {owner!r}):\n"
        "    print('held', flush=True); time.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait(10)
