"""The one seam for connections to metadata stores (PostgreSQL servers holding catalogs).

Rules (spec reshard §4.9, §4.11; safeguards reshard-51, -67, -69):

- **Secrets.** The password reaches psycopg only as the separate ``password=`` keyword, never
  inside a DSN or conninfo string; port explicit; ``connect_timeout`` always set;
  ``application_name`` names the operation.
- **TLS is mandatory.** ``sslmode`` is one of ``require``, ``verify-ca``, ``verify-full``; an
  empty one means ``verify-full``; ``disable``, ``allow`` and ``prefer`` (which can run in clear)
  are refused before any packet is sent (:class:`InsecureSSLMode`; :func:`sslmode_refusal` is the
  check for the API edge). The CA is ``DUCKGRES_STORE_SSLROOTCERT`` (a PEM path, or ``system``:
  the OS trust store, which implies ``verify-full``). :func:`tls_params` is the same policy as
  libpq keywords, for the ``pg_dump`` conninfo.
- **SCRAM only.** Every connection sets ``require_auth=scram-sha-256`` (libpq 16+; psycopg's
  bundled libpq is 18): a server that asks for a cleartext or MD5 password, or for none, is
  refused by libpq before anything secret is sent. An older libpq is refused
  (:class:`LibpqTooOld`).
- **Pinned sessions.** Before its first query every session is pinned in one round trip of
  schema-qualified calls (:func:`pin_session`): ``search_path`` empty (a tenant's objects in
  ``public`` can never shadow a built-in function or operator), ``row_security = off`` (a table
  whose row-security policy would apply makes the statement fail instead of running the tenant's
  policy code, as ``pg_dump`` does), and ``statement_timeout``/``lock_timeout`` (no statement
  waits forever; the runner passes values sized from its step's deadline, others get
  :data:`DEFAULT_STATEMENT_TIMEOUT`). Connections through a transaction pooler (tenant probes)
  pass ``pin=False``: a session setting would leak onto other clients' server connections;
  they run nothing but ``SELECT 1``.

- **The checked address is the address used** (:func:`pinned_host`). A store's host name is
  resolved once per connection; every address it resolves to is checked against
  ``DUCKGRES_STORE_HOST_DENYLIST`` (link-local, cloud metadata, wildcard: :func:`denied_network`)
  and the connection goes to exactly those addresses (libpq ``hostaddr``, one per address, in
  order) while ``host`` stays the name, so TLS still verifies the name. A name whose DNS answer
  changes between a check and the connection (rebinding) can therefore never steer a session,
  a password or ``pg_dump`` to a denied address: a denied answer fails the connection
  (:class:`DeniedStoreAddress`) before any packet is sent to it.

Auth failures are classified so waits can report a stranded password with its remedy.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass
from typing import Any

import psycopg
from django.conf import settings
from psycopg import pq

AUTH_SQLSTATES = frozenset({"28P01", "28000"})
AUTH_TEXTS = ("sasl authentication failed", "password authentication failed")

SECURE_SSLMODES = ("require", "verify-ca", "verify-full")
DEFAULT_SSLMODE = "verify-full"
REQUIRE_AUTH = "scram-sha-256"
REQUIRE_AUTH_MIN_LIBPQ = 16  # the first libpq that knows require_auth
SYSTEM_ROOTCERT = "system"
# Statements of connections opened without explicit limits (the API's identity reads, the
# backup's fact read): a minute is far more than any of them needs.
DEFAULT_STATEMENT_TIMEOUT = 60.0


class InsecureSSLMode(psycopg.OperationalError):
    """A metadata-store endpoint whose sslmode could run without TLS; nothing was sent."""


class LibpqTooOld(psycopg.OperationalError):
    """The libpq psycopg uses cannot enforce ``require_auth``; nothing was sent."""


class DeniedStoreAddress(psycopg.OperationalError):
    """The store's host is, or resolves to, a denied address; nothing was sent to it."""


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def denied_network(address: str) -> Network | None:
    """The ``DUCKGRES_STORE_HOST_DENYLIST`` network holding the literal ``address`` (an
    IPv4-mapped IPv6 address is judged as its IPv4 form), or ``None``."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        candidates.append(ip.ipv4_mapped)
    networks: tuple[Network, ...] = tuple(settings.DUCKGRES_STORE_HOST_DENYLIST)
    for candidate in candidates:
        for network in networks:
            if candidate.version == network.version and candidate in network:
                return network
    return None


def pinned_host(host: str, port: int) -> dict[str, str]:
    """libpq ``host``/``hostaddr`` for ``host``: a literal address (or a socket directory) as
    is, a name resolved once with each address checked and pinned (see the module rules).
    A name that does not resolve is passed on unpinned: libpq then fails to resolve it too."""
    text = host.strip()
    if not text or text.startswith("/"):
        return {"host": host}
    literal = text.strip("[]")
    try:
        ipaddress.ip_address(literal.split("%", 1)[0])
    except ValueError:
        pass
    else:
        network = denied_network(literal)
        if network is not None:
            raise DeniedStoreAddress(f"{text} is in the denied network {network}")
        return {"host": host}
    try:
        infos = socket.getaddrinfo(text, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return {"host": host}
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        network = denied_network(address)
        if network is not None:
            raise DeniedStoreAddress(
                f"{text} resolves to {address}, in the denied network {network} "
                "(DUCKGRES_STORE_HOST_DENYLIST): nothing was sent to it"
            )
    if not addresses:
        return {"host": host}
    return {"host": ",".join([text] * len(addresses)), "hostaddr": ",".join(addresses)}


def sslmode_refusal(sslmode: str) -> str | None:
    """The message refusing ``sslmode`` for a metadata store, or None when it is acceptable
    (empty = ``verify-full``). The API edge calls this for every store and binding it accepts."""
    if sslmode in ("", *SECURE_SSLMODES):
        return None
    return (
        f"sslmode {sslmode} is refused for metadata stores: connections must use TLS "
        f"({', '.join(SECURE_SSLMODES)}; empty means {DEFAULT_SSLMODE})"
    )


def effective_sslmode(sslmode: str) -> str:
    """The sslmode a connection uses; raises :class:`InsecureSSLMode` for a refused one."""
    problem = sslmode_refusal(sslmode)
    if problem:
        raise InsecureSSLMode(problem)
    mode = sslmode or DEFAULT_SSLMODE
    if settings.DUCKGRES_STORE_SSLROOTCERT == SYSTEM_ROOTCERT:
        return "verify-full"  # libpq refuses sslrootcert=system with a weaker mode
    return mode


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    sslmode: str

    def redacted(self, database: str, user: str) -> str:
        """The only form in which an endpoint is logged (§2.7)."""
        mode = self.sslmode or DEFAULT_SSLMODE
        return f"{self.host}:{self.port}/{database} (user {user}, sslmode {mode})"


def _system_ca_file() -> str:
    """The OpenSSL default CA bundle (for clients whose libpq predates ``sslrootcert=system``)."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and os.path.isfile(candidate):
            return candidate
    raise InsecureSSLMode(
        "DUCKGRES_STORE_SSLROOTCERT=system, but this client's libpq is older than 16 and no "
        "system CA bundle file was found"
    )


def tls_params(endpoint: Endpoint, *, libpq16: bool) -> dict[str, str]:
    """The libpq keywords of the TLS and authentication policy: ``sslmode``, ``sslrootcert``
    when configured, and ``require_auth`` when the client's libpq knows it (``libpq16``; an older
    libpq, e.g. ``pg_dump`` 15's, cannot refuse a cleartext password request — docs/backup.md)."""
    params = {"sslmode": effective_sslmode(endpoint.sslmode)}
    rootcert = settings.DUCKGRES_STORE_SSLROOTCERT
    if rootcert == SYSTEM_ROOTCERT and not libpq16:
        params["sslrootcert"] = _system_ca_file()
    elif rootcert:
        params["sslrootcert"] = rootcert
    if libpq16:
        params["require_auth"] = REQUIRE_AUTH
    return params


def libpq_major() -> int:
    """The major version of the libpq psycopg is using."""
    return int(pq.version()) // 10000


def _ms(seconds: float) -> str:
    return str(max(1, int(seconds * 1000)))


def pin_session(
    conn: psycopg.Connection[Any],
    *,
    statement_timeout: float | None = None,
    lock_timeout: float | None = None,
) -> None:
    """Pin ``search_path`` (empty), ``row_security`` (off) and, when given, the two timeouts
    (seconds) for the rest of the session, in one statement. Every function is called
    schema-qualified, so the pin itself resolves nothing through the old search path. In a
    non-autocommit connection the pin is committed (a rollback would undo it)."""
    names = ["search_path", "row_security"]
    values = ["", "off"]
    if statement_timeout is not None:
        names.append("statement_timeout")
        values.append(_ms(statement_timeout))
    if lock_timeout is not None:
        names.append("lock_timeout")
        values.append(_ms(lock_timeout))
    calls = ", ".join(["pg_catalog.set_config(%s, %s, false)"] * len(names))
    conn.execute(
        f"SELECT {calls}",  # placeholders only: every name and value is a parameter
        [item for pair in zip(names, values, strict=True) for item in pair],
    )
    if not conn.autocommit:
        conn.commit()


def connect(
    endpoint: Endpoint,
    *,
    dbname: str,
    user: str,
    password: str | None,
    application_name: str = "duckgres-admin",
    connect_timeout: int = 10,
    autocommit: bool = True,
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
    lock_timeout: float | None = None,
    pin: bool = True,
) -> psycopg.Connection[tuple[object, ...]]:
    """Open a connection under the rules above (``lock_timeout`` defaults to
    ``statement_timeout``); the password travels only as its own keyword argument."""
    major = libpq_major()
    if major < REQUIRE_AUTH_MIN_LIBPQ:
        raise LibpqTooOld(
            f"libpq {pq.version()} cannot enforce require_auth={REQUIRE_AUTH}; metadata-store "
            f"connections need libpq {REQUIRE_AUTH_MIN_LIBPQ} or newer (psycopg[binary])"
        )
    params: dict[str, Any] = {
        **pinned_host(endpoint.host, endpoint.port),
        "port": endpoint.port,
        "dbname": dbname,
        "user": user,
        "password": password or None,
        "connect_timeout": connect_timeout,
        "application_name": application_name,
        **tls_params(endpoint, libpq16=True),
    }
    conn = psycopg.connect(autocommit=autocommit, **params)
    if pin:
        try:
            pin_session(
                conn,
                statement_timeout=statement_timeout,
                lock_timeout=statement_timeout if lock_timeout is None else lock_timeout,
            )
        except BaseException:
            conn.close()
            raise
    return conn


def probe(
    endpoint: Endpoint,
    *,
    dbname: str,
    user: str,
    password: str | None,
    application_name: str = "duckgres-admin",
    connect_timeout: int = 8,
) -> None:
    """Connect and ``SELECT 1``; raises the psycopg error on failure."""
    with connect(
        endpoint,
        dbname=dbname,
        user=user,
        password=password,
        application_name=application_name,
        connect_timeout=connect_timeout,
    ) as conn:
        conn.execute("SELECT 1")


def is_auth_failure(exc: BaseException) -> bool:
    """SQLSTATE 28P01/28000, or the message of a connection-time SASL/password failure."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in AUTH_SQLSTATES:
        return True
    text = str(exc).lower()
    return any(marker in text for marker in AUTH_TEXTS)
