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
- **verify-full unless explicitly allowed** (safeguard reshard-122). ``require`` and
  ``verify-ca`` are accepted only with an opt-in: a store's ``tls_policy = allow-weaker`` (with a
  reason), which is also the opt-in of an external endpoint registered as an ``external`` store.
  The API edges (store, binding and start writes) refuse a weaker mode without it with
  :func:`weaker_sslmode_refusal`; the database refuses a store row without it; this seam trusts
  the vetted fields it is handed (as runners trust vetted secret references).
- **SCRAM with channel binding only** (safeguard reshard-123). Every connection sets
  ``require_auth=scram-sha-256`` (libpq 16+; psycopg's bundled libpq is 18) and
  ``channel_binding=require`` (libpq 13+): a server that asks for a cleartext or MD5 password,
  or for none, or that cannot bind the SCRAM exchange to the TLS channel it presented (a relay,
  a TLS-terminating proxy), is refused by libpq before anything secret is sent. Two exceptions
  get ``channel_binding=prefer`` (``require_auth`` still applies): a connection that may go
  through a transaction pooler (``pin=False``: PgBouncer does not implement SCRAM-SHA-256-PLUS)
  and an endpoint listed in ``DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT`` (TLS terminated in front
  of the server). A conninfo that could refuse neither way — an exempt endpoint and a client
  whose libpq predates ``require_auth`` — is never built (:class:`CannotRefuseCleartext`). An
  older psycopg libpq is refused (:class:`LibpqTooOld`).
- **Secrets go only where they are bound** (safeguard reshard-124): before connecting, the
  password is checked against ``DUCKGRES_SECRET_REF_ENDPOINTS`` for the references it was
  resolved from (``lib.secretrefs.check_endpoint``); a refusal is :class:`SecretNotBoundHere`.
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
  (:class:`DeniedStoreAddress`) before any packet is sent to it. The host itself must pass the
  syntax rule of ``lib.hosts`` (safeguard reshard-125: no comma list, socket directory or zone
  id), else :class:`InvalidStoreHost`.

- **No hostile server holds a caller for ever** (safeguard reshard-127). Every connection sets
  ``connect_timeout`` (per address: a name pinned to k addresses may take k times it) and TCP
  keepalives with ``tcp_user_timeout`` (:func:`socket_params`): a peer that vanishes (network
  partition, powered off) is detected within about a minute even in the middle of a statement.
  A live peer that accepts and never answers, or answers the login and then stalls, is not
  caught by keepalives (its kernel acknowledges them): the login is bounded by
  ``connect_timeout``, and a probe's query by :func:`socket_deadline`, which shuts the socket
  down when its time is up (a cancel request would go to the same server, which may ignore it).
  :func:`probe` is bounded in total by ``connect_timeout`` per address plus ``query_seconds``.

Auth failures are classified so waits can report a stranded password with its remedy.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from django.conf import settings
from psycopg import pq, sql

from duckgres_admin.lib import endpoints, hosts, secretrefs

AUTH_SQLSTATES = frozenset({"28P01", "28000"})
AUTH_TEXTS = ("sasl authentication failed", "password authentication failed")

SECURE_SSLMODES = ("require", "verify-ca", "verify-full")
DEFAULT_SSLMODE = "verify-full"
WEAKER_SSLMODES = ("require", "verify-ca")  # accepted only with an explicit opt-in
TLS_POLICY_FIELD = "tls_policy"
ALLOW_WEAKER = "allow-weaker"
REQUIRE_AUTH = "scram-sha-256"
REQUIRE_AUTH_MIN_LIBPQ = 16  # the first libpq that knows require_auth
CHANNEL_BINDING_MIN_LIBPQ = 13  # the first libpq that knows channel_binding
CHANNEL_BINDING_EXEMPT_SETTING = "DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT"
SYSTEM_ROOTCERT = "system"
# Dead-peer detection on every connection (safeguard reshard-127): keepalive probes after 30 s
# of silence, every 10 s, 3 unanswered ones end it; data unacknowledged for 60 s ends it too.
KEEPALIVES_IDLE = 30
KEEPALIVES_INTERVAL = 10
KEEPALIVES_COUNT = 3
TCP_USER_TIMEOUT_MS = 60_000
# The bound of a probe's query (a server that answers the login and then stalls).
PROBE_QUERY_SECONDS = 8.0
# Statements of connections opened without explicit limits (the API's identity reads, the
# backup's fact read): a minute is far more than any of them needs.
DEFAULT_STATEMENT_TIMEOUT = 60.0


class InsecureSSLMode(psycopg.OperationalError):
    """A metadata-store endpoint whose sslmode could run without TLS; nothing was sent."""


class LibpqTooOld(psycopg.OperationalError):
    """The libpq psycopg uses cannot enforce ``require_auth``; nothing was sent."""


class DeniedStoreAddress(psycopg.OperationalError):
    """The store's host is, or resolves to, a denied address; nothing was sent to it."""


class InvalidStoreHost(psycopg.OperationalError):
    """The store's host is not a DNS name or one literal address (``lib.hosts``); nothing was
    resolved or sent."""


class CannotRefuseCleartext(psycopg.OperationalError):
    """No conninfo was built: the client could not refuse a cleartext password request."""


class SecretNotBoundHere(psycopg.OperationalError):
    """The password's secret reference is not bound to this endpoint; nothing was sent."""


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
    """libpq ``host``/``hostaddr`` for ``host``: a literal address as is, a name resolved once
    with each address checked and pinned (see the module rules). A name that does not resolve
    is passed on unpinned: libpq then fails to resolve it too. A host that breaks the syntax
    rule (``lib.hosts``: a host list, a socket directory, a zone id) is
    :class:`InvalidStoreHost`, before anything is resolved or sent."""
    problem = hosts.syntax_refusal("host", host)
    if problem is not None:
        raise InvalidStoreHost(problem)
    text = host
    try:
        ipaddress.ip_address(text)
    except ValueError:
        pass
    else:
        network = denied_network(text)
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


def weaker_sslmode_refusal(sslmode: str, *, field: str, allowed: bool, fix: str) -> str | None:
    """The message refusing a weaker ``sslmode`` (``require``, ``verify-ca``) of ``field`` when
    there is no explicit opt-in (``allowed``), else None; ``fix`` says how to opt in."""
    mode = sslmode or DEFAULT_SSLMODE
    if mode not in WEAKER_SSLMODES or allowed:
        return None
    unchecked = (
        "the server's host name (and, without DUCKGRES_STORE_SSLROOTCERT, its certificate)"
        if mode == "require"
        else "the server's host name"
    )
    return (
        f"{field}: sslmode {mode} does not check {unchecked}, so a server impersonating it "
        f"would be trusted; it is accepted only with an explicit opt-in: {fix}, or use sslmode "
        f"{DEFAULT_SSLMODE}"
    )


def store_opt_in_fix(store: str) -> str:
    """How a store opts in (the ``fix`` of :func:`weaker_sslmode_refusal`)."""
    return f"set {TLS_POLICY_FIELD} {ALLOW_WEAKER} and a tls_policy_reason on store {store}"


def external_opt_in_fix(host: str, port: int) -> str:
    """How an external endpoint opts in: an ``external`` store registered for it."""
    return (
        f"register {endpoints.hostport(host, port)} as an external metadata store (kind "
        f"external, host {host}, port {port}) with {TLS_POLICY_FIELD} {ALLOW_WEAKER} and a "
        "tls_policy_reason"
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


def parse_channel_binding_exempt(
    raw: str,
) -> tuple[tuple[endpoints.EndpointPattern, ...], list[str]]:
    """``DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT``: comma-separated ``host:port`` patterns."""
    return endpoints.parse_patterns(CHANNEL_BINDING_EXEMPT_SETTING, raw)


def channel_binding_exempt(host: str, port: int) -> bool:
    """Is ``host:port`` listed in ``DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT``?"""
    patterns = getattr(settings, CHANNEL_BINDING_EXEMPT_SETTING, ())
    return any(p.matches(host, port) for p in patterns)


def channel_binding_mode(endpoint: Endpoint, *, pooled: bool = False) -> str:
    """``require``, or ``prefer`` for a pooled connection or an exempt endpoint (module rules)."""
    if pooled or channel_binding_exempt(endpoint.host, endpoint.port):
        return "prefer"
    return "require"


def tls_params(endpoint: Endpoint, *, libpq16: bool, pooled: bool = False) -> dict[str, str]:
    """The libpq keywords of the TLS and authentication policy: ``sslmode``, ``sslrootcert``
    when configured, ``channel_binding`` (every supported client's libpq is 13+) and
    ``require_auth`` when the client's libpq knows it (``libpq16``). Either of
    ``channel_binding=require`` and ``require_auth`` makes libpq refuse a cleartext password
    request; without both (an exempt endpoint and an older libpq, e.g. ``pg_dump`` 15's) this
    raises :class:`CannotRefuseCleartext` instead of returning a conninfo that would send it."""
    params = {"sslmode": effective_sslmode(endpoint.sslmode)}
    rootcert = settings.DUCKGRES_STORE_SSLROOTCERT
    if rootcert == SYSTEM_ROOTCERT and not libpq16:
        params["sslrootcert"] = _system_ca_file()
    elif rootcert:
        params["sslrootcert"] = rootcert
    params["channel_binding"] = channel_binding_mode(endpoint, pooled=pooled)
    if libpq16:
        params["require_auth"] = REQUIRE_AUTH
    elif params["channel_binding"] != "require":
        raise CannotRefuseCleartext(
            f"{endpoints.hostport(endpoint.host, endpoint.port)} is exempt from channel binding "
            f"({CHANNEL_BINDING_EXEMPT_SETTING}), and a libpq older than "
            f"{REQUIRE_AUTH_MIN_LIBPQ} cannot refuse a cleartext password request otherwise "
            "(require_auth): use a PostgreSQL 16 or newer client (the image's PostgreSQL 18 "
            "client; DUCKGRES_PG_BIN_DIRS)"
        )
    return params


def tls_summary(endpoint: Endpoint, *, weaker_allowed_by: str = "") -> dict[str, object]:
    """What a connection to ``endpoint`` really uses, for the dry run: the effective sslmode
    (an empty one is verify-full; ``system`` CA turns every mode into verify-full), the mode as
    configured, who allowed a weaker mode (``weaker_allowed_by``, e.g. ``store X: <reason>``; a
    weaker mode in effect without it is ``explicit: false``), channel binding and require_auth."""
    try:
        mode: str | None = effective_sslmode(endpoint.sslmode)
        problem = None
    except InsecureSSLMode as exc:
        mode, problem = None, str(exc)
    weaker = mode in WEAKER_SSLMODES
    out: dict[str, object] = {
        "sslmode": mode,
        "configured_sslmode": endpoint.sslmode,
        "weaker_than_verify_full": weaker,
        "weaker_allowed_explicitly": bool(weaker and weaker_allowed_by),
        "weaker_allowed_by": weaker_allowed_by if weaker else None,
        "channel_binding": channel_binding_mode(endpoint),
        "require_auth": REQUIRE_AUTH,
    }
    if problem:
        out["refused"] = problem
    return out


def check_secret_endpoint(password: str | None, host: str, port: int) -> None:
    """Raise :class:`SecretNotBoundHere` when ``password`` came from secret references none of
    which ``DUCKGRES_SECRET_REF_ENDPOINTS`` binds to ``host:port`` (module rules). Every
    connection of this module calls it; the ``pg_dump``/``pg_restore`` conninfo does too."""
    try:
        secretrefs.check_endpoint(password, host, port)
    except secretrefs.SecretRefError as exc:
        raise SecretNotBoundHere(str(exc)) from None


def socket_params() -> dict[str, int]:
    """The libpq keywords of dead-peer detection (module rules); every connection uses them."""
    return {
        "keepalives": 1,
        "keepalives_idle": KEEPALIVES_IDLE,
        "keepalives_interval": KEEPALIVES_INTERVAL,
        "keepalives_count": KEEPALIVES_COUNT,
        "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
    }


@contextlib.contextmanager
def socket_deadline(conn: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """Shut ``conn``'s socket down if the body still runs after ``seconds``: a statement
    waiting on a server that stopped answering then fails at once (psycopg ``OperationalError``)
    instead of waiting for ever. The socket is held through a duplicate descriptor, so the shut
    down can never reach a descriptor the process reused after ``conn`` closed."""
    held = socket.socket(fileno=os.dup(conn.pgconn.socket))

    def expire() -> None:
        with contextlib.suppress(OSError):
            held.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # an expiry in progress finishes before the duplicate is closed
        held.close()  # closes the duplicate only; the connection's socket stays as it is


def libpq_major() -> int:
    """The major version of the libpq psycopg is using."""
    return int(pq.version()) // 10000


def drop_database(database: str, server_version: int) -> sql.Composed:
    """``DROP DATABASE IF EXISTS`` with ``WITH (FORCE)`` where the server has it (13+): FORCE
    ends the sessions the caller may end. A PostgreSQL 12 server gets the plain statement,
    which fails while a session is on the database (callers wait for them first)."""
    force = sql.SQL(" WITH (FORCE)") if server_version >= 130000 else sql.SQL("")
    return sql.SQL("DROP DATABASE IF EXISTS {}{}").format(sql.Identifier(database), force)


def _ms(seconds: float) -> str:
    return str(max(1, int(seconds * 1000)))


# PostgreSQL cancels an autovacuum (not one preventing wraparound) that blocks a lock request
# only once the request has waited the requester's deadlock_timeout (1 s by default). A session
# that may lower it makes an autovacuum of a large catalog table yield within this instead.
AUTOVACUUM_YIELD_MS = 50


def yield_autovacuum_sooner(conn: psycopg.Connection[Any]) -> bool:
    """Lower the session's ``deadlock_timeout`` to :data:`AUTOVACUUM_YIELD_MS` where the
    current user may set it (a superuser, or on PostgreSQL 15+ a role a superuser gave ``GRANT
    SET ON PARAMETER deadlock_timeout``); True when it did. Call it before any ``SET ROLE``: the
    privilege is the login's. Elsewhere the server's value stays (no error, no statement
    that could fail)."""
    row = conn.execute(
        "SELECT pg_catalog.set_config('deadlock_timeout', %s, false) WHERE "
        + may_set_sql(conn, "deadlock_timeout"),
        (f"{AUTOVACUUM_YIELD_MS}ms",),
    ).fetchone()
    return row is not None


def may_set_sql(conn: psycopg.Connection[Any], parameter: str) -> str:
    """A boolean SQL expression: the current user may set the superuser-only ``parameter`` (a
    superuser, or on PostgreSQL 15+ a role given ``GRANT SET ON PARAMETER``). Chosen by the
    server's version, since ``has_parameter_privilege`` does not exist before 15. ``parameter``
    is one of this product's constants, never input."""
    if conn.info.server_version >= 150000:
        return f"pg_catalog.has_parameter_privilege('{parameter}', 'SET')"
    return "pg_catalog.current_setting('is_superuser') = 'on'"


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
    ``statement_timeout``); the password travels only as its own keyword argument. ``pin=False``
    marks a connection that may go through a transaction pooler (no pin, channel binding
    ``prefer``)."""
    major = libpq_major()
    if major < REQUIRE_AUTH_MIN_LIBPQ:
        raise LibpqTooOld(
            f"libpq {pq.version()} cannot enforce require_auth={REQUIRE_AUTH}; metadata-store "
            f"connections need libpq {REQUIRE_AUTH_MIN_LIBPQ} or newer (psycopg[binary])"
        )
    check_secret_endpoint(password, endpoint.host, endpoint.port)
    params: dict[str, Any] = {
        **pinned_host(endpoint.host, endpoint.port),
        "port": endpoint.port,
        "dbname": dbname,
        "user": user,
        "password": password or None,
        "connect_timeout": connect_timeout,
        "application_name": application_name,
        **socket_params(),
        **tls_params(endpoint, libpq16=True, pooled=not pin),
    }
    conn = psycopg.connect(autocommit=autocommit, **params)
    if pin:
        try:
            with socket_deadline(conn, connect_timeout):  # the pin is part of the login
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
    query_seconds: float = PROBE_QUERY_SECONDS,
) -> None:
    """Connect and ``SELECT 1``; raises the psycopg error on failure. Bounded in total: the
    login by ``connect_timeout`` (per address), the pin and the query by ``query_seconds``
    (:func:`socket_deadline`)."""
    with (
        connect(
            endpoint,
            dbname=dbname,
            user=user,
            password=password,
            application_name=application_name,
            connect_timeout=connect_timeout,
            statement_timeout=query_seconds,
        ) as conn,
        socket_deadline(conn, query_seconds),
    ):
        conn.execute("SELECT 1")


def is_auth_failure(exc: BaseException) -> bool:
    """SQLSTATE 28P01/28000, or the message of a connection-time SASL/password failure."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in AUTH_SQLSTATES:
        return True
    text = str(exc).lower()
    return any(marker in text for marker in AUTH_TEXTS)
