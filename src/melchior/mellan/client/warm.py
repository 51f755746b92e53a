"""The receiver's HTTP connections, with the idle check httpcore makes on every request
made cheap.

Before each request httpcore's pool asks every idle connection whether it expired, and
for HTTP/1.1 that means asking its stream ``get_extra_info("is_readable")`` (has the
server closed it?). On the anyio backend that builds the stream's whole attribute table
— a dict of lambdas, one per layer — to read one socket, per idle connection, per
request: 13 % of a receiver's CPU in the issue-25 profile. The same answer comes from
the raw socket, which does not change for a connection's life (TLS wraps it, never
replaces it): :class:`_Stream` keeps it and answers from it, passing everything else
through. :func:`warm` puts that wrapper between an ``httpx.AsyncClient``'s pool and its
network backend; a client built some other way (a proxy, a future httpx) is left as it
is, only slower.
"""

# ruff: noqa: ASYNC109 (the timeout parameters are httpcore's interface, passed through)

from __future__ import annotations

import ssl
import typing
from collections.abc import Iterable

import httpcore
import httpx
from httpcore._utils import is_socket_readable

SocketOption = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)


class _Stream(httpcore.AsyncNetworkStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._socket = inner.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _Stream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":
            return self._socket is None or is_socket_readable(self._socket)
        if info == "socket":
            return self._socket
        return self._inner.get_extra_info(info)


class _Backend(httpcore.AsyncNetworkBackend):
    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _Stream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _Stream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def warm(client: httpx.AsyncClient) -> bool:
    """Give ``client``'s connection pool the cheap idle check; False if its transport is
    not the plain pool this knows (then nothing changed)."""
    transport = getattr(client, "_transport", None)
    pool = getattr(transport, "_pool", None)
    if type(pool) is not httpcore.AsyncConnectionPool:
        return False
    inner = getattr(pool, "_network_backend", None)
    if not isinstance(inner, httpcore.AsyncNetworkBackend) or isinstance(inner, _Backend):
        return isinstance(inner, _Backend)
    pool._network_backend = _Backend(inner)  # no public way to pass one
    return True
