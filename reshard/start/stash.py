"""The in-process password stash and the pull URL (spec reshard §4.17, safeguard reshard-79).

The stash maps ``op id -> external target password`` in this API process only; it is never
written anywhere. The API therefore runs one server process per replica (threads inside it),
and the runner pulls the password from the replica whose own address is in ``password_url``
(on ``DUCKGRES_PASSWORD_PULL_PORT`` when set: the listener only runner pods may reach).

Invariants of the handoff:

- An entry is handed out at most once: :func:`take` removes it under the lock, so of two
  concurrent pulls at most one gets the value and every later pull (a replay, a relaunched
  runner after a takeover) gets 404. There is no second pull.
- It is handed out only to the op's current runner, proven by what that runner alone holds
  (``reshard.start.operations.reshard_password_fetch``): a runner pod's projected ServiceAccount
  token (audience ``DUCKGRES_PASSWORD_PULL_AUDIENCE``), checked by TokenReview against the op's
  runner pod name and the pod uid the claim recorded; a local runner's one-time credential,
  checked against the digest its launcher stored. The runner id and epoch are checked too, but
  they are not secrets. A refused pull leaves the entry in place.
- Entries of terminal (or vanished) ops are pruned on every start and every password request,
  and every minute by the API process's pruner thread (:func:`start_pruner`, started by
  gunicorn's ``post_worker_init``) while it holds any; the start path deletes the entry when
  enqueueing the runner launch fails, a cancel before the claim deletes it, and a terminal op's
  password request deletes it.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading

from django.conf import settings

from duckgres_admin.models import TERMINAL_STATES, ReshardOperation

_lock = threading.Lock()
_entries: dict[int, str] = {}
_log = logging.getLogger("duckgres.reshard.stash")
PRUNE_INTERVAL_SECONDS = 60.0


class NoAddressError(RuntimeError):
    """The control plane could not determine its own address for the password URL."""


def put(op_id: int, password: str) -> None:
    with _lock:
        _entries[op_id] = password


def get(op_id: int) -> str | None:
    with _lock:
        return _entries.get(op_id)


def take(op_id: int) -> str | None:
    """Remove and return the entry: the one successful pull (None when there is none)."""
    with _lock:
        return _entries.pop(op_id, None)


def delete(op_id: int) -> None:
    with _lock:
        _entries.pop(op_id, None)


def held_ids() -> list[int]:
    with _lock:
        return sorted(_entries)


def known_values() -> list[str]:
    """Every stashed password, for the scrubber of this process."""
    with _lock:
        return list(_entries.values())


def prune() -> int:
    """Drop entries of terminal (or vanished) ops; returns how many were dropped."""
    ids = held_ids()
    if not ids:
        return 0
    live = set(
        ReshardOperation.objects.filter(pk__in=ids)
        .exclude(state__in=TERMINAL_STATES)
        .values_list("pk", flat=True)
    )
    dropped = 0
    with _lock:
        for op_id in ids:
            if op_id not in live and op_id in _entries:
                del _entries[op_id]
                dropped += 1
    return dropped


def start_pruner(
    interval: float = PRUNE_INTERVAL_SECONDS, stop: threading.Event | None = None
) -> threading.Thread:
    """A daemon thread that prunes terminal ops' entries every ``interval`` seconds while the
    stash holds any (no query otherwise), so an entry never outlives its op by much even when
    no request arrives. ``stop`` ends it (tests)."""
    from django.db import close_old_connections

    halt = stop or threading.Event()

    def loop() -> None:
        while not halt.wait(interval):
            try:
                if held_ids():
                    prune()
            except Exception as exc:  # noqa: BLE001 - the next round retries
                _log.warning("password stash prune failed: %s", type(exc).__name__)
            finally:
                close_old_connections()

    thread = threading.Thread(target=loop, name="password-stash-pruner", daemon=True)
    thread.start()
    return thread


def clear() -> None:
    """Tests only: forget everything."""
    with _lock:
        _entries.clear()


def _first_global_unicast() -> str:
    """The first global-unicast address of this host (IPv4 preferred), or ''."""
    candidates: list[str] = []
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        infos = []
    for info in infos:
        candidates.append(str(info[4][0]))
    # A UDP "connect" sends nothing; it only asks the kernel which source address routes out.
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((probe, 9))
                candidates.append(str(sock.getsockname()[0]))
        except OSError:
            continue
    for candidate in candidates:
        try:
            addr = ipaddress.ip_address(candidate.split("%", 1)[0])
        except ValueError:
            continue
        if addr.is_global or (addr.is_private and not addr.is_loopback and not addr.is_link_local):
            return str(addr)
    return ""


def advertise_address(launcher: str) -> str:
    """``DUCKGRES_ADVERTISE_ADDRESS``, else ``POD_IP``, else detected (local: ``127.0.0.1``)."""
    if settings.DUCKGRES_ADVERTISE_ADDRESS:
        return str(settings.DUCKGRES_ADVERTISE_ADDRESS)
    if settings.POD_IP:
        return str(settings.POD_IP)
    if launcher == "local":
        return "127.0.0.1"
    return _first_global_unicast()


def advertise_port() -> int:
    """``DUCKGRES_PASSWORD_PULL_PORT`` when set (the route is served only there), else
    ``DUCKGRES_ADVERTISE_PORT``."""
    return int(settings.DUCKGRES_PASSWORD_PULL_PORT) or int(settings.DUCKGRES_ADVERTISE_PORT)


def password_url(op_id: int, launcher: str) -> str:
    """``<scheme>://<address>:<port>/api/v1/reshards/<id>/password`` (IPv6 bracketed); the port
    is :func:`advertise_port`."""
    address = advertise_address(launcher)
    if not address:
        raise NoAddressError(
            "control plane could not determine its own address for the password URL; "
            "set DUCKGRES_ADVERTISE_ADDRESS or POD_IP"
        )
    host = address
    try:
        if ipaddress.ip_address(address.strip("[]")).version == 6:
            host = f"[{address.strip('[]')}]"
    except ValueError:
        pass
    return (
        f"{settings.DUCKGRES_ADVERTISE_SCHEME}://{host}:{advertise_port()}"
        f"/api/v1/reshards/{op_id}/password"
    )
