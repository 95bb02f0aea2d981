"""The one seam to S3 (boto3/botocore). Nothing else in the project imports them.

Configuration (spec reshard §6): ``DUCKGRES_S3_ENDPOINT_URL`` (empty = AWS),
``DUCKGRES_AWS_REGION`` (the fallback when the warehouse has no ``data_region``) and
``DUCKGRES_S3_ADDRESSING_STYLE`` (``auto`` | ``path`` | ``virtual``). Credentials come from the
ambient chain, or from an STS ``AssumeRole`` of the warehouse's ``data_role_arn`` (spec §4.10
step 1): the role is assumed at once, so a credential problem fails before any work starts,
and the temporary credentials are refreshed by botocore before they expire.

A runner that was given an operation-scoped session (``DUCKGRES_RESHARD_S3_SESSION`` set by
its launcher, credentials in its environment) assumes no role: that session is all the S3
authority it holds. :func:`mint_session` is how a launcher mints one (AssumeRole of the
warehouse's role, or GetFederationToken without one, always with a session policy). STS is
reached at ``DUCKGRES_STS_ENDPOINT_URL``, else ``AWS_ENDPOINT_URL_STS``, else the S3 endpoint
when one is configured (S3-compatible servers serve STS there), else AWS's regional STS.

Only thin wrappers of the multipart calls are offered: callers own the upload loop.
Deliberate choices:
- request checksums only ``when_required``: botocore ≥ 1.36 otherwise adds CRC trailers
  (``aws-chunked`` bodies over HTTPS) that some S3-compatible servers reject; integrity is
  the caller's size check (per-part checksums are out of scope, spec §9);
- nothing reads the ``ETag`` of ``CompleteMultipartUpload`` (RGW returns it empty) — callers
  ``HEAD`` the object instead;
- error texts never contain credentials (botocore errors name the operation and the code).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.config
import botocore.credentials
import botocore.exceptions
import botocore.session
from django.conf import settings

from duckgres_admin.platform.names import runner_name

# AssumeRole session length; botocore refreshes 15 min (advisory) / 10 min (mandatory) before
# expiry, so one-hour sessions are renewed well before any call can see an expired token.
ASSUME_ROLE_SECONDS = 3600
CONNECT_TIMEOUT_SECONDS = 10
READ_TIMEOUT_SECONDS = 120
MAX_ATTEMPTS = 5


class S3Error(RuntimeError):
    """Any failure of an S3/STS call, with the operation and the service's error code."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


def _describe(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        message = str(err.get("Message", "")) or code
        op = getattr(exc, "operation_name", "")
        return f"{op}: {code or 'error'} (HTTP {status}): {message}", code
    return f"{type(exc).__name__}: {exc}", ""


def _wrap(what: str, exc: BaseException) -> S3Error:
    text, code = _describe(exc)
    return S3Error(f"{what}: {text}", code)


@dataclass(frozen=True)
class ListedObject:
    """One object of a bounded listing (:meth:`S3.list_objects`)."""

    key: str
    size: int
    last_modified: dt.datetime
    etag: str = ""


@dataclass(frozen=True)
class ObjectHead:
    """What :meth:`S3.head` reports of an object."""

    size: int
    etag: str  # without the quotes
    version_id: str = ""  # '' in an unversioned bucket


def plain_etag(etag: str) -> str:
    """An ETag without its surrounding quotes (listings and HEAD quote it, some servers not)."""
    return etag.strip().strip('"')


@dataclass(frozen=True)
class Uploaded:
    """An uploaded part: what ``complete`` needs."""

    part_number: int
    etag: str


def session_name_for_op(op_id: int) -> str:
    return runner_name(op_id)


def _assume_role_refresher(
    sts: Any, role_arn: str, session_name: str
) -> Callable[[], dict[str, str]]:
    def refresh() -> dict[str, str]:
        try:
            resp = sts.assume_role(
                RoleArn=role_arn,
                RoleSessionName=session_name,
                DurationSeconds=ASSUME_ROLE_SECONDS,
            )
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _wrap(f"STS AssumeRole of {role_arn}", exc) from exc
        creds = resp["Credentials"]
        expiry = creds["Expiration"]
        if isinstance(expiry, dt.datetime):
            expiry = expiry.astimezone(dt.UTC).isoformat()
        return {
            "access_key": creds["AccessKeyId"],
            "secret_key": creds["SecretAccessKey"],
            "token": creds["SessionToken"],
            "expiry_time": str(expiry),
        }

    return refresh


@dataclass(frozen=True)
class SessionCredentials:
    """Temporary credentials minted by :func:`mint_session` (the secret parts never repr)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str = field(repr=False)
    expiration: dt.datetime


def sts_endpoint_url() -> str | None:
    """Where STS is asked (module docstring); None = botocore's default for the region."""
    if settings.DUCKGRES_STS_ENDPOINT_URL:
        return str(settings.DUCKGRES_STS_ENDPOINT_URL)
    if os.environ.get("AWS_ENDPOINT_URL_STS"):
        return None  # botocore reads it itself
    return str(settings.DUCKGRES_S3_ENDPOINT_URL) or None


def _sts_client(core: Any, region: str | None) -> Any:
    """STS with the ambient credentials of ``core``."""
    return boto3.Session(botocore_session=core).client(
        "sts",
        region_name=region,
        endpoint_url=sts_endpoint_url(),
        config=botocore.config.Config(
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            read_timeout=30,
        ),
    )


def mint_session(
    *, region: str, role_arn: str, session_name: str, policy: str, seconds: int
) -> SessionCredentials:
    """Temporary credentials limited by ``policy`` (a compact JSON session policy): AssumeRole of
    ``role_arn`` with it, or, without a role, GetFederationToken (which needs long-term IAM user
    credentials as the ambient ones). The result can do at most what both the role (or user)
    and the policy allow. Raises :class:`S3Error` naming the call; never a credential."""
    core = botocore.session.get_session()
    sts = _sts_client(core, region or settings.DUCKGRES_AWS_REGION or None)
    try:
        if role_arn:
            resp = sts.assume_role(
                RoleArn=role_arn,
                RoleSessionName=session_name,
                Policy=policy,
                DurationSeconds=seconds,
            )
        else:
            resp = sts.get_federation_token(
                Name=session_name[:32], Policy=policy, DurationSeconds=seconds
            )
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        what = f"STS AssumeRole of {role_arn}" if role_arn else "STS GetFederationToken"
        raise _wrap(what, exc) from exc
    creds = resp["Credentials"]
    expiry = creds["Expiration"]
    if not isinstance(expiry, dt.datetime):
        expiry = dt.datetime.fromisoformat(str(expiry))
    return SessionCredentials(
        access_key_id=str(creds["AccessKeyId"]),
        secret_access_key=str(creds["SecretAccessKey"]),
        session_token=str(creds["SessionToken"]),
        expiration=expiry.astimezone(dt.UTC),
    )


def _client_config(addressing_style: str | None = None) -> Any:
    return botocore.config.Config(
        s3={"addressing_style": addressing_style or settings.DUCKGRES_S3_ADDRESSING_STYLE},
        retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
        max_pool_connections=10,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


class ObjectStream:
    """An object's body being read (:meth:`S3.stream_object`): iterate for the chunks, then
    ``close()`` (also when nothing was read: it releases the connection)."""

    def __init__(self, uri: str, size: int, body: Any, chunk_bytes: int) -> None:
        self.uri, self.size, self._body, self._chunk_bytes = uri, size, body, chunk_bytes

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._body.iter_chunks(chunk_size=self._chunk_bytes)
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            raise _wrap(f"read {self.uri}", exc) from exc

    def close(self) -> None:
        self._body.close()


class S3:
    """An S3 client bound to one region (and optionally one assumed role).

    ``client`` is the raw botocore client; tests use ``client.meta.events`` to observe requests.
    """

    def __init__(
        self,
        *,
        region: str = "",
        role_arn: str = "",
        session_name: str = "duckgres-admin",
        endpoint_url: str | None = None,
        addressing_style: str | None = None,
        credentials: SessionCredentials | None = None,
    ) -> None:
        self.region = region or settings.DUCKGRES_AWS_REGION or None
        self.endpoint_url = (
            endpoint_url if endpoint_url is not None else settings.DUCKGRES_S3_ENDPOINT_URL
        ) or None
        core = botocore.session.get_session()
        if settings.DUCKGRES_RESHARD_S3_SESSION or credentials is not None:
            role_arn = ""  # an operation-scoped session is all this client may hold
        if credentials is not None:
            core.set_credentials(
                credentials.access_key_id,
                credentials.secret_access_key,
                credentials.session_token,
            )
        if role_arn:
            sts = _sts_client(core, self.region)
            refresh = _assume_role_refresher(sts, role_arn, session_name)
            # Assume now: credential problems fail before the caller starts any work.
            creds = botocore.credentials.RefreshableCredentials.create_from_metadata(
                metadata=refresh(), refresh_using=refresh, method="sts-assume-role"
            )
            core = botocore.session.get_session()
            core._credentials = creds  # the documented-by-practice way to inject refreshables
        self._session = boto3.Session(botocore_session=core)
        if not role_arn and self._session.get_credentials() is None:
            raise S3Error(
                "no AWS credentials found (environment, web identity, shared config or "
                "instance profile)"
            )
        try:
            self.client: Any = self._session.client(
                "s3",
                region_name=self.region,
                endpoint_url=self.endpoint_url,
                config=_client_config(addressing_style),
            )
        except (botocore.exceptions.BotoCoreError, ValueError) as exc:
            raise _wrap("create S3 client", exc) from exc

    # --- multipart --------------------------------------------------------------------------
    def create_multipart_upload(
        self, bucket: str, key: str, content_type: str = "application/octet-stream"
    ) -> str:
        """Start an upload (no tagging, no metadata); returns the upload id."""
        try:
            resp = self.client.create_multipart_upload(
                Bucket=bucket, Key=key, ContentType=content_type
            )
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _wrap(f"create multipart upload s3://{bucket}/{key}", exc) from exc
        return str(resp["UploadId"])

    def upload_part(
        self, bucket: str, key: str, upload_id: str, part_number: int, body: Any
    ) -> Uploaded:
        """Upload one part; ``body`` is bytes or a seekable file-like object with ``len()``."""
        try:
            resp = self.client.upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=part_number, Body=body
            )
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _wrap(f"upload part {part_number}", exc) from exc
        return Uploaded(part_number, str(resp.get("ETag", "")))

    def complete_multipart_upload(
        self, bucket: str, key: str, upload_id: str, parts: list[Uploaded]
    ) -> str:
        """Complete the upload; returns the new object's ``VersionId`` ('' in an unversioned
        bucket). The response's ETag is ignored (RGW returns it empty): :meth:`head` reads it."""
        try:
            resp = self.client.complete_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={
                    "Parts": [
                        {"PartNumber": p.part_number, "ETag": p.etag}
                        for p in sorted(parts, key=lambda p: p.part_number)
                    ]
                },
            )
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _wrap(f"complete multipart upload s3://{bucket}/{key}", exc) from exc
        version = resp.get("VersionId") if isinstance(resp, dict) else None
        return str(version) if version and version != "null" else ""

    def abort_multipart_upload(self, bucket: str, key: str, upload_id: str) -> None:
        """Abort; an already-gone upload (``NoSuchUpload``, 404) counts as aborted."""
        try:
            self.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except botocore.exceptions.ClientError as exc:
            text, code = _describe(exc)
            if code in {"NoSuchUpload", "404"}:
                return
            raise S3Error(f"abort multipart upload s3://{bucket}/{key}: {text}", code) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise _wrap(f"abort multipart upload s3://{bucket}/{key}", exc) from exc

    def list_multipart_uploads(
        self, bucket: str, prefix: str = "", *, limit: int | None = None
    ) -> list[tuple[str, str]]:
        """``(key, upload_id)`` of the open uploads under ``prefix``: all of them, or the first
        ``limit`` (the listing stops paging there)."""
        out: list[tuple[str, str]] = []
        try:
            paginator = self.client.get_paginator("list_multipart_uploads")
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                for upload in page.get("Uploads", []) or []:
                    out.append((str(upload["Key"]), str(upload["UploadId"])))
                if limit is not None and len(out) >= limit:
                    return out[:limit]
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _wrap(f"list multipart uploads in s3://{bucket}/{prefix}", exc) from exc
        return out

    # --- objects ----------------------------------------------------------------------------
    def head(self, bucket: str, key: str, *, version_id: str = "") -> ObjectHead | None:
        """The object's size, ETag (quotes stripped) and VersionId; ``None`` when it does not
        exist."""
        extra = {"VersionId": version_id} if version_id else {}
        try:
            resp = self.client.head_object(Bucket=bucket, Key=key, **extra)
        except botocore.exceptions.ClientError as exc:
            text, code = _describe(exc)
            if code in {"404", "NoSuchKey", "NotFound"}:
                return None
            raise S3Error(f"head s3://{bucket}/{key}: {text}", code) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise _wrap(f"head s3://{bucket}/{key}", exc) from exc
        version = str(resp.get("VersionId") or "")
        return ObjectHead(
            int(resp["ContentLength"]),
            plain_etag(str(resp.get("ETag", ""))),
            "" if version == "null" else version,
        )

    def head_size(self, bucket: str, key: str) -> int | None:
        """The object's ``ContentLength``; ``None`` when it does not exist."""
        found = self.head(bucket, key)
        return None if found is None else found.size

    def stream_object(
        self,
        bucket: str,
        key: str,
        chunk_bytes: int = 1024 * 1024,
        *,
        if_match: str = "",
        version_id: str = "",
    ) -> ObjectStream:
        """The object's body as chunks of at most ``chunk_bytes``, read from the socket as they
        are consumed: memory stays bounded by one chunk whatever the size. ``if_match``: the
        object must still have that ETag (else ``S3Error`` code ``PreconditionFailed``);
        ``version_id``: exactly that version (a versioned bucket keeps it whatever is written
        over the key). A read failure while iterating raises :class:`S3Error`; close the stream
        when done."""
        extra: dict[str, str] = {}
        if if_match:
            extra["IfMatch"] = if_match if if_match.startswith('"') else f'"{if_match}"'
        if version_id:
            extra["VersionId"] = version_id
        try:
            resp = self.client.get_object(Bucket=bucket, Key=key, **extra)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _wrap(f"get s3://{bucket}/{key}", exc) from exc
        return ObjectStream(
            f"s3://{bucket}/{key}", int(resp["ContentLength"]), resp["Body"], chunk_bytes
        )

    def delete_object(self, bucket: str, key: str) -> None:
        try:
            self.client.delete_object(Bucket=bucket, Key=key)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _wrap(f"delete s3://{bucket}/{key}", exc) from exc

    def list_objects(
        self, bucket: str, prefix: str, *, limit: int
    ) -> tuple[list[ListedObject], bool]:
        """At most ``limit`` objects under ``prefix`` (S3's key order) and whether more exist:
        the listing stops paging there (a hard cap, whatever the bucket holds)."""
        out: list[ListedObject] = []
        token: str | None = None
        try:
            while len(out) <= limit:
                kwargs: dict[str, Any] = {
                    "Bucket": bucket,
                    "Prefix": prefix,
                    "MaxKeys": max(1, min(1000, limit + 1 - len(out))),
                }
                if token:
                    kwargs["ContinuationToken"] = token
                page = self.client.list_objects_v2(**kwargs)
                for item in page.get("Contents", []) or []:
                    modified = item["LastModified"]
                    if modified.tzinfo is None:
                        modified = modified.replace(tzinfo=dt.UTC)
                    out.append(
                        ListedObject(
                            str(item["Key"]), int(item["Size"]), modified, str(item.get("ETag", ""))
                        )
                    )
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token:
                    break
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _wrap(f"list s3://{bucket}/{prefix}", exc) from exc
        return out[:limit], len(out) > limit

    def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key under ``prefix`` (tests, cleanup checks)."""
        keys: list[str] = []
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                keys.extend(str(o["Key"]) for o in page.get("Contents", []) or [])
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _wrap(f"list s3://{bucket}/{prefix}", exc) from exc
        return keys


def _redacted_endpoint(url: str) -> str:
    """``url`` without user info, query or fragment (an endpoint is never a secret carrier)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else "(unparsable)"


def describe_aws_context() -> str:
    """One line naming this process's AWS context, for a start-up log line (never a secret).

    The default region and where it comes from, the S3 endpoint boto3 resolves for it (user
    info, query and fragment dropped), the addressing style, and the credential source as
    botocore reports it (``Credentials.method``: ``env``, ``shared-credentials-file``,
    ``assume-role-with-web-identity``, ``iam-role``, ``container-role`` …). No access key id,
    secret key or session token enters the line. Resolving the source may ask the instance
    metadata service (botocore's 1 s timeout, one attempt). Never raises.
    """
    session = boto3.Session(botocore_session=botocore.session.get_session())
    region = settings.DUCKGRES_AWS_REGION or session.region_name or None
    if settings.DUCKGRES_AWS_REGION:
        region_text = f"region {region} (DUCKGRES_AWS_REGION)"
    elif region:
        region_text = f"region {region} (AWS environment or config)"
    else:
        region_text = "no default region (each warehouse's data_region)"
    configured = settings.DUCKGRES_S3_ENDPOINT_URL or None
    try:
        client = session.client(
            "s3", region_name=region, endpoint_url=configured, config=_client_config()
        )
        endpoint = _redacted_endpoint(str(client.meta.endpoint_url))
    except Exception as exc:  # noqa: BLE001 - a log line must not stop the process
        endpoint = f"unresolved ({type(exc).__name__})"
    source = "DUCKGRES_S3_ENDPOINT_URL" if configured else "boto3's default for the region"
    try:
        credentials = session.get_credentials()
        found = f"from {credentials.method}" if credentials is not None else "none found"
    except Exception as exc:  # noqa: BLE001 - as above
        found = f"unknown ({type(exc).__name__})"
    if settings.DUCKGRES_RESHARD_S3_SESSION:
        scope = f"an operation-scoped session: {settings.DUCKGRES_RESHARD_S3_SESSION}; no role "
        scope += "is assumed"
    else:
        scope = "the ambient chain; a warehouse's data_role_arn is assumed with them"
    return (
        f"AWS context: {region_text}; S3 endpoint {endpoint} ({source}), addressing style "
        f"{settings.DUCKGRES_S3_ADDRESSING_STYLE}; credentials {found} ({scope})"
    )
