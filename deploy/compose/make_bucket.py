#!/usr/bin/env python3
"""Make sure a bucket exists on the stack's S3 endpoint: a one-shot service.

    python make_bucket.py BUCKET [BUCKET...]

The endpoint is ``PIPELINE_S3_ENDPOINT_URL`` (unset or empty: AWS S3),
credentials come from the standard AWS chain, as for the pipeline itself.
Waits up to ``MAKE_BUCKET_WAIT`` seconds (default 120) for the endpoint to
answer (a store that is still starting), then: the bucket answers HEAD ->
nothing to do; 404 -> create it (in the client's region); anything else, e.g.
403 for a bucket someone else owns -> exit 1 with the error.

The `bucket` one-shot of docker-compose.yml runs it for RESULTS_BUCKET, against the
stack's SeaweedFS (which starts empty; a bucket persists on its volume) or AWS S3.
"""

from __future__ import annotations

import os
import sys
import time


def main(buckets: list[str]) -> int:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError

    if not buckets:
        print("usage: make_bucket.py BUCKET [BUCKET...]", file=sys.stderr)
        return 2
    endpoint = os.environ.get("PIPELINE_S3_ENDPOINT_URL", "").strip() or None
    style = {"addressing_style": "path"} if endpoint else {}
    s3 = boto3.client("s3", endpoint_url=endpoint, config=Config(s3=style))
    region = s3.meta.region_name
    where = endpoint or f"AWS S3 ({region})"
    deadline = time.monotonic() + float(os.environ.get("MAKE_BUCKET_WAIT", "120"))
    for bucket in buckets:
        delay = 0.5
        while True:
            try:
                s3.head_bucket(Bucket=bucket)
                print(f"make_bucket: s3://{bucket} exists on {where}")
                break
            except (EndpointConnectionError, ConnectionClosedError, ClientError) as exc:
                code = (
                    exc.response.get("Error", {}).get("Code", "")
                    if isinstance(exc, ClientError)
                    else "unreachable"
                )
                if code == "unreachable" or code.startswith("5"):
                    # The store is still starting: poll, backing off, until the deadline.
                    if time.monotonic() > deadline:
                        print(f"make_bucket: {where} does not answer: {exc}", file=sys.stderr)
                        return 1
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                if code not in ("404", "NoSuchBucket", "NotFound"):
                    print(f"make_bucket: s3://{bucket} on {where}: {exc}", file=sys.stderr)
                    return 1
                kwargs = {}
                if region and region != "us-east-1":
                    kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
                s3.create_bucket(Bucket=bucket, **kwargs)
                print(f"make_bucket: created s3://{bucket} on {where}")
                break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
