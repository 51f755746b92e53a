"""The receiver client's cheap idle check, against a real socket server: a connection the
server closed while idle is seen as such and replaced (not reused and failed)."""

from __future__ import annotations

import asyncio

from melchior.mellan import transport
from melchior.mellan.client.receiver import AsyncReceiverClient
from melchior.mellan.client.warm import warm

RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}"


def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    async def main() -> tuple[int, list[int]]:
        connections = 0
        closed = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await reader.readuntil(b"\r\n\r\n")
            writer.write(RESPONSE)  # keep-alive by HTTP/1.1 default, then closed anyway
            await writer.drain()
            writer.close()
            closed.set()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        client = transport.async_client(url, None, base_url=url)
        assert warm(client)
        assert warm(client)  # a second call changes nothing
        statuses = []
        try:
            async with server:
                for _ in range(3):
                    closed.clear()
                    statuses.append((await client.get("/")).status_code)
                    await closed.wait()
                    await asyncio.sleep(0.05)  # the FIN reaches the client's socket
        finally:
            await client.aclose()
        return connections, statuses

    connections, statuses = asyncio.run(main())
    assert statuses == [200, 200, 200]
    assert connections == 3  # each closed idle connection was seen and replaced


def test_the_receiver_client_is_warmed() -> None:
    async def main() -> bool:
        client = AsyncReceiverClient("http://127.0.0.1:9", "token")
        try:
            pool = client._http._transport._pool  # type: ignore[attr-defined]
            return type(pool._network_backend).__name__ == "_Backend"
        finally:
            await client.aclose()

    assert asyncio.run(main())
