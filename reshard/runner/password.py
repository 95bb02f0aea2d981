"""The runner side of the password handoff (spec reshard §4.2 step 4, §5.3, safeguard 7).

``GET <password_url>`` with the runner secret, the claimed epoch and the runner id; at most 3
attempts, each with a 10 s timeout, 2 s apart (the pause aborts on ``stop``). 200 → the JSON
``password`` (an unparsable body or an empty password is final). 404 is final at once: the
stash is gone, the op is terminal, or this runner is no longer the op's current runner. Other
statuses and transport errors retry. The value is never logged; errors never quote the body.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from duckgres_admin.lib import http

ATTEMPTS = 3
TIMEOUT_SECONDS = 10.0
PAUSE_SECONDS = 2.0
MAX_BODY_BYTES = 1024 * 1024


class PasswordPullError(Exception):
    """The pull failed; the message names the cause, never the value or the body."""


@dataclass(frozen=True)
class PullRequest:
    url: str
    runner_secret: str
    epoch: int
    runner_id: str


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
                "password not available (HTTP 404: the stash entry is gone, the operation is "
                "terminal, or this runner is no longer the operation's current runner)"
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
