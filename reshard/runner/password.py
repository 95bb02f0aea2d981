"""The runner side of the password handoff (spec reshard §4.2 step 4, §5.3, safeguards 7, 79).

``GET <password_url>`` with the runner secret, the claimed epoch, the runner id and
``Authorization: Bearer <credential>``, where the credential is what only this runner holds:

- a runner pod: its projected ServiceAccount token (:data:`PULL_TOKEN_PATH`, audience
  ``DUCKGRES_PASSWORD_PULL_AUDIENCE``, 600 s, rotated by the kubelet; read at pull time). The
  API checks it with TokenReview against the op's runner pod name and the pod uid its claim
  recorded, so the token of any other pod is refused.
- a local runner: the one-time credential its launcher wrote into an inherited pipe (the fd
  number is in ``DUCKGRES_RESHARD_PASSWORD_PULL_FD``; the credential itself is never in the
  environment or argv). :func:`take_inherited_credential` reads it once at process start and
  closes the pipe; the API compares its digest with the one the launcher stored on the op.

At most 3 attempts, each with a 10 s timeout, 2 s apart (the pause aborts on ``stop``). 200 →
the JSON ``password`` (an unparsable body or an empty password is final); the API removes the
entry with that answer, so there is no second pull. 404 is final at once: the entry is gone
(already pulled, the API restarted), the op is terminal, or this runner is no longer the op's
current runner. 401/403 are final too: this runner could not prove it is the op's runner.
Other statuses and transport errors retry. Neither the value nor the credential is ever
logged; errors never quote the body.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from duckgres_admin.lib import http

# The credential's channels (re-exported by ``reshard.launchers.envcontract``; this module loads
# no launcher, so a bare process can use it).
PULL_FD_VAR = "DUCKGRES_RESHARD_PASSWORD_PULL_FD"
PULL_TOKEN_DIR = "/var/run/secrets/duckgres-admin/password-pull"
PULL_TOKEN_FILE = "token"
PULL_TOKEN_PATH = f"{PULL_TOKEN_DIR}/{PULL_TOKEN_FILE}"
PULL_TOKEN_SECONDS = 600  # the projected token's lifetime (the API server's minimum)

ATTEMPTS = 3
TIMEOUT_SECONDS = 10.0
PAUSE_SECONDS = 2.0
MAX_BODY_BYTES = 1024 * 1024
MAX_CREDENTIAL_BYTES = 16 * 1024


class PasswordPullError(Exception):
    """The pull failed; the message names the cause, never the value or the body."""


@dataclass(frozen=True)
class PullRequest:
    url: str
    runner_secret: str
    epoch: int
    runner_id: str
    credential: str = field(default="", repr=False)


def take_inherited_credential(environ: Mapping[str, str] | None = None) -> str:
    """A local runner's one-time credential, read from the inherited pipe (then closed); ''
    when none was handed over. Call once, at process start."""
    raw = (os.environ if environ is None else environ).get(PULL_FD_VAR, "")
    if not raw.isdigit():
        return ""
    fd = int(raw)
    data = b""
    try:
        while len(data) <= MAX_CREDENTIAL_BYTES:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        return ""
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return data.decode("ascii", errors="ignore").strip()


def read_pod_token(path: str = PULL_TOKEN_PATH) -> str:
    """The runner pod's projected ServiceAccount token ('' when not mounted)."""
    try:
        return Path(path).read_text(encoding="ascii", errors="ignore").strip()
    except OSError:
        return ""


def pull_password(
    request: PullRequest,
    stop: threading.Event,
    *,
    attempts: int = ATTEMPTS,
    timeout: float = TIMEOUT_SECONDS,
    pause: float = PAUSE_SECONDS,
) -> str:
    """Return the target password or raise :class:`PasswordPullError`."""
    headers = {
        "X-Duckgres-Runner-Secret": request.runner_secret,
        "X-Duckgres-Op-Epoch": str(request.epoch),
        "X-Duckgres-Runner-Id": request.runner_id,
        "Accept": "application/json",
    }
    if request.credential:
        headers["Authorization"] = f"Bearer {request.credential}"
    last = "no attempt made"
    for attempt in range(1, attempts + 1):
        if attempt > 1 and stop.wait(pause):
            raise PasswordPullError(f"password pull interrupted after {attempt - 1} attempts")
        try:
            response = http.get(
                request.url, headers=headers, timeout=timeout, max_bytes=MAX_BODY_BYTES
            )
        except http.HttpTransportError as exc:
            last = f"attempt {attempt}/{attempts}: {exc}"
            continue
        if response.status == 200:
            return _parse(response)
        if response.status == 404:
            raise PasswordPullError(
                "password not available (HTTP 404: the stash entry is gone — it is handed out "
                "once — the operation is terminal, or this runner is no longer the operation's "
                "current runner)"
            )
        if response.status in (401, 403):
            raise PasswordPullError(
                f"password pull refused (HTTP {response.status}: this runner could not prove "
                "it is the operation's runner"
                + ("" if request.credential else "; it holds no pull credential")
                + ")"
            )
        last = f"attempt {attempt}/{attempts}: HTTP {response.status}"
    raise PasswordPullError(f"password pull failed after {attempts} attempts; last: {last}")


def _parse(response: http.HttpResponse) -> str:
    if response.truncated:
        raise PasswordPullError("password response body exceeds 1 MiB")
    try:
        payload = json.loads(response.body)
    except ValueError:
        raise PasswordPullError("password response is not valid JSON") from None
    value = payload.get("password") if isinstance(payload, dict) else None
    if not isinstance(value, str) or value == "":
        raise PasswordPullError("password response carries no password")
    return value
