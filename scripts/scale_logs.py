"""Event-loop stalls, connection errors and timeouts found in a simulated fleet's logs.

Dask logs "Event loop was unresponsive in <Server> for <s>s" when a tick of an
event loop lasted over ``distributed.admin.tick.limit`` (3 s): a stall, counted
apart (its text mentions timeouts). Any other line naming an error, an exception,
a traceback, a timeout or a refused/reset connection counts as an error. HAProxy
(``option tcplog``) ends each session line with a termination state: a lower-case
``c``/``s`` first means a client or server timeout, ``SC`` a refused connect.
"""

from __future__ import annotations

import re
from pathlib import Path

STALL = re.compile(r"Event loop was unresponsive in (\w+) for ([0-9.]+)s")
ERROR = re.compile(
    r"error|exception|traceback|timed out|timeout|refused|reset by peer|broken pipe",
    re.IGNORECASE,
)
# "... 0/0/12 1234 SC 1/1/0/0/3 0/0": the state follows the byte count.
HAPROXY_STATE = re.compile(r" \d+/-?\d+/-?\d+ \d+ ([-A-Za-z]{2}) \d+/\d+/\d+/\d+/\d+ ")


def scan_logs(log_dir: Path, samples: int = 5) -> dict:
    """Per log file: stalls (count, longest), errors (count, first lines); totals."""
    files: dict[str, dict] = {}
    totals = {"errors": 0, "stalls": 0, "longest_stall_seconds": 0.0}
    for path in sorted(Path(log_dir).glob("*.log")):
        entry = {"stalls": 0, "longest_stall_seconds": 0.0, "errors": 0, "error_lines": []}
        haproxy = path.name.startswith("haproxy")
        for line in path.read_text(errors="replace").splitlines():
            stall = STALL.search(line)
            if stall:
                entry["stalls"] += 1
                seconds = float(stall.group(2))
                entry["longest_stall_seconds"] = max(entry["longest_stall_seconds"], seconds)
                continue
            if haproxy:
                state = HAPROXY_STATE.search(line)
                bad = bool(state) and (state.group(1)[0] in "cs" or state.group(1) == "SC")
            else:
                bad = bool(ERROR.search(line))
            if bad:
                entry["errors"] += 1
                if len(entry["error_lines"]) < samples:
                    entry["error_lines"].append(line[:300])
        files[path.name] = entry
        totals["errors"] += entry["errors"]
        totals["stalls"] += entry["stalls"]
        totals["longest_stall_seconds"] = max(
            totals["longest_stall_seconds"], entry["longest_stall_seconds"]
        )
    return {**totals, "files": files}
