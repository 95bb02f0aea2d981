"""The quickstart's secrets, made once inside the cluster (docs/kubernetes.md "Quickstart").

Run by the Job duckgres-quickstart-secrets with the product image. No value is ever written in
a manifest or printed: each one is drawn here from the ``secrets`` module, and a Secret that
already exists is left exactly as it is, so applying the overlay again (or re-running this Job)
never rotates a password the running servers already hold. The Secrets:

- duckgres-quickstart: the PostgreSQL superuser, config-store, provisioner and tenant passwords
  and the Redis password, read by the quickstart's servers;
- duckgres-admin: what k8s/templates/secret.yaml lists, pointing at those servers;
- duckgres-store-quickstart and duckgres-tenant-quickstart: the provisioner's and the demo
  tenant's password, named by the demo's secret references (the allowlists' prefixes).
"""

from __future__ import annotations

import base64
import os
import secrets
import sys
import time

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

NAMESPACE = os.environ["POD_NAMESPACE"]
PG = f"duckgres-quickstart-pg.{NAMESPACE}.svc"


def token() -> str:
    return secrets.token_urlsafe(32)


def read(api: client.CoreV1Api, name: str) -> dict[str, str] | None:
    try:
        found = api.read_namespaced_secret(name, NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}


def ensure(api: client.CoreV1Api, name: str, values: dict[str, str]) -> dict[str, str]:
    existing = read(api, name)
    if existing is not None:
        print(f"quickstart: Secret {name} exists: left as it is", flush=True)
        return existing
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(
            name=name, labels={"app": "duckgres-quickstart", "duckgres.io/quickstart": "true"}
        ),
        string_data=values,
        type="Opaque",
    )
    api.create_namespaced_secret(NAMESPACE, body)
    print(f"quickstart: Secret {name} created ({len(values)} keys)", flush=True)
    return values


def main() -> int:
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    api = client.CoreV1Api()
    deadline = time.monotonic() + 120
    while True:  # the API server may still be admitting this namespace's first objects
        try:
            read(api, "duckgres-quickstart")
            break
        except ApiException as exc:
            if time.monotonic() > deadline:
                raise
            print(f"quickstart: the API server answered {exc.status}; retrying", flush=True)
            time.sleep(2)
    base = ensure(
        api,
        "duckgres-quickstart",
        {
            "postgres-password": token(),
            "config-store-password": token(),
            "provisioner-password": token(),
            "tenant-password": token(),
            "redis-password": token(),
            "s3-access-key-id": "quickstart",
            "s3-secret-access-key": token(),
        },
    )
    ensure(
        api,
        "duckgres-admin",
        {
            "django-secret-key": secrets.token_urlsafe(50),
            "config-store-dsn": (
                f"postgresql://duckgres_admin:{base['config-store-password']}@"
                f"duckgres-quickstart-pg-0.{PG}:5432/duckgres_admin?sslmode=require"
            ),
            "internal-secret": "int-" + secrets.token_hex(24),
            "runner-secret": "run-" + secrets.token_hex(24),
            "dataplane-secret": "dat-" + secrets.token_hex(24),
            "broker-url": (
                f"redis://:{base['redis-password']}@duckgres-quickstart-redis.{NAMESPACE}.svc"
                ":6379/0"
            ),
            "aws-access-key-id": base["s3-access-key-id"],
            "aws-secret-access-key": base["s3-secret-access-key"],
        },
    )
    ensure(api, "duckgres-store-quickstart", {"provisioner": base["provisioner-password"]})
    ensure(api, "duckgres-tenant-quickstart", {"password": base["tenant-password"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
