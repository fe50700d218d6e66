#!/bin/sh
# The Compose stack's S3: SeaweedFS (`weed server` with its S3 gateway), data on /data.
#
# Only the S3 gateway listens beyond the container (0.0.0.0:$S3_PORT, default 9000); the
# master, volume server and filer talk on loopback. Requests are signed and checked
# against one identity, S3_ACCESS_KEY_ID / S3_SECRET_ACCESS_KEY, allowed everything:
# the stack's clients use the same keys (docker-compose.yml). Buckets persist on the
# volume; the `bucket` one-shot creates the results bucket (deploy/compose/make_bucket.py).
set -eu
: "${S3_ACCESS_KEY_ID:?the store's access key id}"
: "${S3_SECRET_ACCESS_KEY:?the store's secret key}"
case "$S3_ACCESS_KEY_ID$S3_SECRET_ACCESS_KEY" in
  *'"'* | *'\'*) echo "seaweedfs.sh: S3 keys must not contain '\"' or '\\'" >&2; exit 2 ;;
esac
port=${S3_PORT:-9000}
config=${TMPDIR:-/tmp}/seaweedfs-s3.json
umask 077
printf '{"identities": [{"name": "stack", "credentials": [{"accessKey": "%s", "secretKey": "%s"}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}\n' \
  "$S3_ACCESS_KEY_ID" "$S3_SECRET_ACCESS_KEY" >"$config"
exec weed -logtostderr server -dir=/data \
  -ip=127.0.0.1 -ip.bind=127.0.0.1 \
  -master.volumeSizeLimitMB=1024 -volume.max=0 \
  -filer \
  -s3 -s3.port="$port" -s3.ip.bind=0.0.0.0 -s3.config="$config" \
  -s3.autoCreateBucket=false -s3.port.iceberg=0 -s3.port.lance=0
