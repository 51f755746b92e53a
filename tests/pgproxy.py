"""A TCP proxy in front of PostgreSQL that can cut a connection at the worst moment.

It forwards every connection untouched, reading the frontend's messages as it goes
(startup, then ``type + length + payload``) so that it knows which connection has run an
``INSERT INTO <table> (`` since its last COMMIT. Armed, it cuts the next such connection
at its ``COMMIT``:

* ``after``: the COMMIT reaches the server and is carried out; the server's answer is
  swallowed and both sockets are closed. The client sees its connection lost while
  committing, yet the transaction *did* commit (the unclear case).
* ``before``: the COMMIT never reaches the server; the server sees its client vanish
  and rolls back. The client sees the very same error.

Connect through it with ``sslmode=disable&gssencmode=disable`` so the stream is plain.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from dataclasses import dataclass, field


@dataclass
class _Conn:
    client: socket.socket
    server: socket.socket
    statements: set[bytes] = field(default_factory=set)  # prepared names inserting into table
    dirty: bool = False  # an insert into the table ran since the last COMMIT


class PgProxy:
    def __init__(self, upstream: tuple[str, int], table: str = "task") -> None:
        self.upstream = upstream
        self.marker = f"INSERT INTO {table} (".encode()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port: int = self.listener.getsockname()[1]
        self.armed: str | None = None  # "after" | "before"
        self.cut = threading.Event()  # set once an armed cut has happened
        self._lock = threading.Lock()
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database_url: str) -> str:
        """``database_url`` (postgresql://user@host:port/db) rerouted through the proxy."""
        scheme, rest = database_url.split("://", 1)
        userinfo, _, hostpath = rest.rpartition("@")
        path = hostpath.split("/", 1)[1]
        who = f"{userinfo}@" if userinfo else ""
        return f"{scheme}://{who}127.0.0.1:{self.port}/{path}?sslmode=disable&gssencmode=disable"

    def arm(self, when: str) -> None:
        assert when in ("after", "before")
        self.cut.clear()
        self.armed = when

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self.listener.close()

    # -- plumbing -------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            conn = _Conn(client, server)
            threading.Thread(target=self._pump, args=(conn,), daemon=True).start()

    def _pump(self, conn: _Conn) -> None:
        buf = b""
        started = False
        try:
            while True:
                ready, _, _ = select.select([conn.client, conn.server], [], [])
                if conn.server in ready:
                    data = conn.server.recv(65536)
                    if not data:
                        return
                    conn.client.sendall(data)
                if conn.client in ready:
                    data = conn.client.recv(65536)
                    if not data:
                        return
                    buf += data
                    if not started:  # StartupMessage (or SSL/GSS request): no type byte
                        if len(buf) < 4:
                            continue
                        (size,) = struct.unpack(">I", buf[:4])
                        if len(buf) < size:
                            continue
                        conn.server.sendall(buf[:size])
                        code = struct.unpack(">I", buf[4:8])[0] if size >= 8 else 0
                        started = code not in (80877103, 80877104)  # SSL/GSS requests
                        buf = buf[size:]
                    while started and len(buf) >= 5:
                        kind = buf[:1]
                        (size,) = struct.unpack(">I", buf[1:5])
                        if len(buf) < 1 + size:
                            break
                        message, buf = buf[: 1 + size], buf[1 + size :]
                        if not self._forward(conn, kind, message[5:], message):
                            return
        except OSError:
            return
        finally:
            for s in (conn.client, conn.server):
                with contextlib.suppress(OSError):
                    s.close()

    def _forward(self, conn: _Conn, kind: bytes, body: bytes, message: bytes) -> bool:
        """Pass one frontend message on; False when the connection has been cut."""
        if kind == b"P":  # Parse: name \0 query \0 ...
            name, _, rest = body.partition(b"\0")
            query = rest.partition(b"\0")[0]
            if self.marker in query:
                conn.statements.add(name)
        elif kind == b"B":  # Bind: portal \0 statement \0 ...
            statement = body.split(b"\0", 2)[1]
            if statement in conn.statements:
                conn.dirty = True
        elif kind == b"Q":  # simple query
            query = body.rstrip(b"\0").strip().upper()
            if self.marker.upper() in query:
                conn.dirty = True
            if query == b"COMMIT":
                with self._lock:
                    when = self.armed if conn.dirty else None
                    if when is not None:
                        self.armed = None
                conn.dirty = False
                if when == "before":
                    self.cut.set()
                    return False
                if when == "after":
                    conn.server.sendall(message)
                    self._await_answer(conn.server)
                    self.cut.set()
                    return False
        conn.server.sendall(message)
        return True

    @staticmethod
    def _await_answer(server: socket.socket) -> None:
        """Read (and drop) the server's answer up to ReadyForQuery: the COMMIT is done."""
        seen = b""
        server.settimeout(10)
        with contextlib.suppress(OSError):
            while b"Z\x00\x00\x00\x05" not in seen:
                data = server.recv(65536)
                if not data:
                    return
                seen += data
