#!/usr/bin/env python3
"""The image's HEALTHCHECK: does this role listen on its TCP ports?

One image runs three roles, and "healthy" means something different for each,
so the ports come from the environment (the image's HEALTHCHECK runs this with
the container's environment):

``HEALTHCHECK_PORTS``
    Comma-separated ports and ranges, e.g. ``8786,8787`` (scheduler: Dask's TLS
    port and its HTTP server) or ``9000-9099`` (workers started with
    ``--worker-port 9000:9099``). Empty or unset: no port to check, healthy
    while the container runs (the driver, one-shot commands).
``HEALTHCHECK_MIN_LISTENING``
    How many of those ports must be listening. Default: every single port
    listed, plus one per range (a worker container sets it to its number of
    worker processes).

Listening sockets are read from ``/proc/net/tcp`` and ``/proc/net/tcp6`` of the
container's network namespace: no connection is opened, so a TLS server never
sees (and logs) a handshake-less probe, and no certificate is needed. With
``--network host`` the namespace is the host's, and the check still answers
"is something listening on the role's ports". Standard library only.

Exit status: 0 healthy, 1 unhealthy (Docker's convention), 2 bad settings.
"""

from __future__ import annotations

import os
import sys

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


def parse_ports(text: str) -> tuple[set[int], int]:
    """The set of ports in ``text`` and the default minimum (singles + ranges)."""
    ports: set[int] = set()
    default_min = 0
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        low, sep, high = part.partition("-")
        first, last = int(low), int(high) if sep else int(low)
        if not 0 < first <= last < 65536:
            raise ValueError(f"bad port or range {part!r}")
        ports.update(range(first, last + 1))
        default_min += 1
    return ports, default_min


def listening_ports() -> set[int]:
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)  # header
                for line in f:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == _LISTEN:
                        found.add(int(fields[1].rsplit(":", 1)[1], 16))
        except FileNotFoundError:  # no IPv6 in this namespace
            continue
    return found


def main() -> int:
    spec = os.environ.get("HEALTHCHECK_PORTS", "").strip()
    if not spec:
        print("healthy: no HEALTHCHECK_PORTS to check")
        return 0
    try:
        wanted, default_min = parse_ports(spec)
        raw_min = os.environ.get("HEALTHCHECK_MIN_LISTENING", "").strip()
        minimum = int(raw_min) if raw_min else default_min
    except ValueError as exc:
        print(f"bad HEALTHCHECK_PORTS/HEALTHCHECK_MIN_LISTENING: {exc}", file=sys.stderr)
        return 2
    up = sorted(wanted & listening_ports())
    if len(up) >= minimum:
        print(f"healthy: listening on {up}")
        return 0
    print(f"unhealthy: {len(up)} of at least {minimum} ports in {spec} listening: {up}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
