#!/bin/sh
# The Compose stack's one-shot `certs` service: make the cluster's TLS material
# with `pipeline certs` unless a complete, valid set is already there.
#
#   CERTS_DIR   where scheduler, workers and driver read it (volume `certs`)
#               default /etc/pipeline/tls
#   CA_KEY_DIR  where the CA's private key goes (volume `ca`, mounted by this
#               service only, so no running Dask container holds the CA key)
#               default /etc/pipeline/ca
#   CERT_HOSTS  SANs, comma-separated; default scheduler,lb,localhost,127.0.0.1
#   CERT_DAYS   validity in days; default 365
#
# Kept as they are when every file exists, the certificates are valid for at
# least another day and their SANs cover CERT_HOSTS; otherwise a new CA and
# new certificates replace them all (a partial set is never patched up).
# Runs as the image's user, so the 0600 keys belong to the uid that every
# pipeline container of the stack runs as.
set -eu

out=${CERTS_DIR:-/etc/pipeline/tls}
ca_dir=${CA_KEY_DIR:-/etc/pipeline/ca}
hosts=${CERT_HOSTS:-scheduler,lb,localhost,127.0.0.1}
days=${CERT_DAYS:-365}
files="ca.pem scheduler.pem scheduler-key.pem worker.pem worker-key.pem client.pem client-key.pem"

complete=yes
for f in $files; do
  [ -s "$out/$f" ] || complete=no
done

if [ "$complete" = yes ] && python - "$out" "$hosts" <<'PY'
import datetime as dt
import sys

from pipeline.cluster.tls import certificate_info, parse_hosts

out, hosts = sys.argv[1], set(parse_hosts(sys.argv[2]))
soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
for role in ("ca", "scheduler", "worker", "client"):
    info = certificate_info(f"{out}/{role}.pem")
    if info["not_after"] < soon:
        sys.exit(f"certs: {role}.pem expires {info['not_after']:%Y-%m-%d %H:%M} UTC")
    missing = hosts - set(info["hosts"]) if role != "ca" else set()
    if missing:
        sys.exit(f"certs: {role}.pem lacks SANs {sorted(missing)}")
PY
then
  echo "certs: keeping the existing TLS files in $out"
  exit 0
fi

[ "$complete" = yes ] || echo "certs: no complete set of TLS files in $out"
echo "certs: making a new CA and certificates for $hosts, valid $days days"
# Make the set in a temporary folder of the same volume, then rename the files
# into place one by one (rename keeps the 0600 mode pipeline certs gave them).
tmp=$(mktemp -d "$out/.new.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pipeline certs --out "$tmp" --days "$days" --host "$hosts"
mkdir -p "$ca_dir"
mv -f "$tmp/ca-key.pem" "$ca_dir/ca-key.pem"
for f in $files; do
  mv -f "$tmp/$f" "$out/$f"
done
ls -l "$out"
