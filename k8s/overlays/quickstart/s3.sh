#!/bin/sh
# The quickstart's S3 server (moto, in memory: a restart loses every object), and the bucket the
# demo warehouse writes its backups to, made once the server answers. Ready (the readiness
# probe reads /tmp/bucket-ready) only once the bucket exists. docs/kubernetes.md "Quickstart".
set -eu
rm -f /tmp/bucket-ready
moto_server -H 0.0.0.0 -p 9000 &
server=$!
trap 'kill -TERM "$server"; wait "$server"; exit 0' TERM INT
python - <<'PY'
import time

import boto3

s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:9000", region_name="us-east-1")
deadline = time.monotonic() + 120
while True:
    try:
        s3.create_bucket(Bucket="duckgres-quickstart-data")
        break
    except Exception as exc:  # the server is still starting
        if time.monotonic() > deadline:
            raise SystemExit(f"quickstart S3: no bucket after 120 s: {exc}")
        time.sleep(1)
print("quickstart S3: bucket duckgres-quickstart-data ready", flush=True)
open("/tmp/bucket-ready", "w").close()
PY
wait "$server"
