"""The in-process password stash and the pull URL (spec reshard §4.17).

The stash maps ``op id -> external target password`` in this API process only; it is never
written anywhere. The API therefore runs one server process per replica (threads inside it),
and the runner pulls the password from the replica whose own address is in ``password_url``.
Entries survive a successful pull (a relaunched runner may pull again while the op is active);
terminal ops are pruned on every start and every password request, and the start path deletes
the entry when enqueueing the runner launch fails.
"""

from __future__ import annotations

import ipaddress
import socket
import threading

from django.conf import settings

from duckgres_admin.models import TERMINAL_STATES, ReshardOperation

_lock = threading.Lock()
_entries: dict[int, str] = {}


class NoAddressError(RuntimeError):
    """The control plane could not determine its own address for the password URL."""


def put(op_id: int, password: str) -> None:
    with _lock:
        _entries[op_id] = password


def get(op_id: int) -> str | None:
    with _lock:
        return _entries.get(op_id)


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


def password_url(op_id: int, launcher: str) -> str:
    """``<scheme>://<address>:<port>/api/v1/reshards/<id>/password`` (IPv6 bracketed)."""
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
        f"{settings.DUCKGRES_ADVERTISE_SCHEME}://{host}:{settings.DUCKGRES_ADVERTISE_PORT}"
        f"/api/v1/reshards/{op_id}/password"
    )
