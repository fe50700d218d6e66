"""Event-loop stalls, connection errors and timeouts found in a simulated fleet's logs.

A log record starts with a timestamp; the lines after it (a traceback) belong to
it. Dask logs "Event loop was unresponsive in <Server> for <s>s" when a tick of an
event loop lasted over ``distributed.admin.tick.limit`` (3 s): a stall, counted
apart (its text mentions timeouts). "Batched Comm Closed" is the scheduler's
stream to a worker that vanished, and "Couldn't gather keys" the scheduler's
report that results held by such workers are gone (the client computes them
again), and "... workers died while trying to run it" a task the scheduler gave up
on because the workers it was sent to kept dying (the runner runs it again). With
``--report`` the scheduler runs distributed's task-stream plugin, which expects
timings on every finished task and logs "Plugin failed with exception ...
KeyError: 'startstops'" for such a given-up task (that task is missing from the
report's task stream, nothing else). All four expected only when a worker process
is killed, counted apart as ``lost_worker_streams``, ``lost_results``,
``killed_tasks`` and ``unstreamed_killed_tasks``. So is a TLS
handshake reset by its peer within :data:`KILL_WINDOW` seconds of the kill (the
killed process's workers were connecting), as ``killed_handshakes``; at another
time it is an error. Any other record naming an error, an
exception, a timeout or a refused/reset connection counts as an error. HAProxy
(``option tcplog``) ends each session line with a termination state: a lower-case
``c``/``s`` first means a client or server timeout, ``SC`` a refused connect.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

# A timestamp (Dask, HAProxy), or asyncio's own messages, which the Dask logging
# setup leaves without one: they start records of their own, not a traceback's tail.
RECORD_START = re.compile(
    r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d|\S+:\d+ \[\d\d/\w{3}/\d{4}"
    r"|Exception in callback |Task exception was never retrieved|Future exception was never)"
)
STALL = re.compile(r"Event loop was unresponsive in (\w+) for ([0-9.]+)s")
#: Records expected when a worker process is killed, counted apart, by their text.
EXPECTED = {
    "lost_worker_streams": "Batched Comm Closed",
    "lost_results": "Couldn't gather keys",
    "killed_tasks": "died while trying to run it",
    "unstreamed_killed_tasks": "KeyError: 'startstops'",
}
#: A handshake reset this long after a worker process was killed was one of its own.
KILL_WINDOW = 10.0
HANDSHAKE_RESET = re.compile(r"TLS handshake failed.*reset by peer")
COUNTS = ("errors", "stalls", *EXPECTED, "killed_handshakes")
ERROR = re.compile(
    r"error|exception|traceback|timed out|timeout|refused|reset by peer|broken pipe",
    re.IGNORECASE,
)
# "... 0/0/12 1234 SC 1/1/0/0/3 0/0": the state follows the byte count.
HAPROXY_STATE = re.compile(r" \d+/-?\d+/-?\d+ \d+ ([-A-Za-z]{2}) \d+/\d+/\d+/\d+/\d+ ")


def _records(text: str) -> list[str]:
    records: list[str] = []
    for line in text.splitlines():
        if RECORD_START.match(line) or not records:
            records.append(line)
        else:
            records[-1] += "\n" + line
    return records


def _is_error(record: str, haproxy: bool) -> bool:
    if haproxy:
        state = HAPROXY_STATE.search(record)
        return bool(state) and (state.group(1)[0] in "cs" or state.group(1) == "SC")
    return bool(ERROR.search(record))


def _sample(record: str) -> str:
    """The record's first lines and, for a traceback, its last (the exception)."""
    lines = record.splitlines()
    if len(lines) > 8:
        lines = [*lines[:3], "...", *lines[-4:]]
    return "\n".join(line[:300] for line in lines)


def _seconds(record: str) -> float | None:
    """The record's time (a Dask log's local time), or None."""
    try:
        return datetime.strptime(record[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def _killed_handshake(record: str, killed_at: float | None) -> bool:
    if killed_at is None or not HANDSHAKE_RESET.search(record):
        return False
    at = _seconds(record)
    return at is not None and killed_at - 1.0 <= at <= killed_at + KILL_WINDOW


def scan_logs(log_dir: Path, samples: int = 5, killed_at: float | None = None) -> dict:
    """Per log file: stalls (count, longest), lost worker streams, errors (count, the
    first lines of the first few); and totals. ``killed_at``: when a worker process
    was killed (``time.time()``), if one was."""
    files: dict[str, dict] = {}
    totals = {key: 0 for key in COUNTS} | {"longest_stall_seconds": 0.0}
    for path in sorted(Path(log_dir).glob("*.log")):
        entry = {key: 0 for key in COUNTS} | {"longest_stall_seconds": 0.0, "error_records": []}
        haproxy = path.name.startswith("haproxy")
        for record in _records(path.read_text(errors="replace")):
            stall = STALL.search(record)
            if stall:
                entry["stalls"] += 1
                seconds = float(stall.group(2))
                entry["longest_stall_seconds"] = max(entry["longest_stall_seconds"], seconds)
            elif expected := next((k for k, text in EXPECTED.items() if text in record), None):
                entry[expected] += 1
            elif _killed_handshake(record, killed_at):
                entry["killed_handshakes"] += 1
            elif _is_error(record, haproxy):
                entry["errors"] += 1
                if len(entry["error_records"]) < samples:
                    entry["error_records"].append(_sample(record))
        files[path.name] = entry
        for key in COUNTS:
            totals[key] += entry[key]
        totals["longest_stall_seconds"] = max(
            totals["longest_stall_seconds"], entry["longest_stall_seconds"]
        )
    return {**totals, "files": files}


#: The runner's log lines about copies of tasks (pipeline/dispatch/copies.py).
COPIES_PEAK = re.compile(r"copies in flight: (\d+), the most so far \(bound: (\d+),")
COPY_MADE = re.compile(r"a backup runs on another worker|running a copy")


def copies_in(driver_log: Path) -> dict:
    """The copies of tasks the driver's log (``-v``) tells of: how many were made, and
    the most in flight at once against their bound."""
    text = driver_log.read_text(errors="replace") if driver_log.exists() else ""
    peaks = [(int(n), int(bound)) for n, bound in COPIES_PEAK.findall(text)]
    return {
        "made": len(COPY_MADE.findall(text)),
        "peak_in_flight": max((n for n, _ in peaks), default=0),
        "bound": max((b for _, b in peaks), default=None),
    }
