#!/usr/bin/env python3
"""The Compose stack's S3-compatible object store: moto's server, in memory.

Starts moto's S3 server on ``0.0.0.0:$S3_PORT`` (default 9000) and creates the
buckets named in ``S3_BUCKETS`` (comma-separated, default ``results``) before
it reports healthy, so a restart of this container comes back with its buckets
(empty: moto keeps everything in memory). Runs until SIGTERM or SIGINT.

``objectstore.py --check`` is the container's health check: exit 0 once every
bucket answers ``HEAD /<bucket>`` with 200.

For local testing only: no persistence, any credentials accepted. See
docker-compose.seaweedfs.yml for a persistent store.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import urllib.error
import urllib.request


def _buckets() -> list[str]:
    return [b.strip() for b in os.environ.get("S3_BUCKETS", "results").split(",") if b.strip()]


def _port() -> int:
    return int(os.environ.get("S3_PORT", "9000"))


def check() -> int:
    for bucket in _buckets():
        request = urllib.request.Request(f"http://127.0.0.1:{_port()}/{bucket}", method="HEAD")
        try:
            with urllib.request.urlopen(request, timeout=3):
                pass
        except (urllib.error.URLError, OSError) as exc:
            print(f"unhealthy: bucket {bucket}: {exc}")
            return 1
    print(f"healthy: buckets {', '.join(_buckets())}")
    return 0


class _NoHealthChecks(logging.Filter):
    """Drop the access-log lines of the health check (HEAD from loopback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("127.0.0.1 ") and '"HEAD /' in message)


def serve() -> int:
    import boto3
    from moto.server import ThreadedMotoServer

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("werkzeug").addFilter(_NoHealthChecks())

    server = ThreadedMotoServer(ip_address="0.0.0.0", port=_port(), verbose=False)
    server.start()
    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{_port()}",
        region_name="us-east-1",
        aws_access_key_id="objectstore",
        aws_secret_access_key="objectstore",
    )
    existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    for bucket in _buckets():
        if bucket not in existing:
            s3.create_bucket(Bucket=bucket)
    print(f"objectstore: moto S3 on :{_port()}, buckets: {', '.join(_buckets())}", flush=True)

    received = signal.sigwait({signal.SIGTERM, signal.SIGINT})
    print(f"objectstore: {signal.Signals(received).name}, stopping", flush=True)
    server.stop()
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(check())
    # Block the signals before any thread starts, so that every thread inherits
    # the mask and sigwait() in the main thread receives them.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    sys.exit(serve())
