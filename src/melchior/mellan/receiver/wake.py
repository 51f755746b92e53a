"""The optional wake webhook: the relay says "work is queued for you", signed.

A receiver needs no inbound listener — its claim long-poll finds work on its own. The
wake-up only saves latency where a long-poll is not held open (``wait = 0`` behind a
proxy that cuts idle requests, or between retries after the relay was unreachable). It
carries no work and no authority: a valid one makes the claim loop ask now instead of
later; an invalid one is refused and changes nothing.

Verified with :func:`melchior.mellan.signing.verify` (HMAC-SHA256 over the timestamp and
the exact body, within the replay window). A replay inside the window is harmless (it
only wakes the loop), so accepted signatures are not remembered.

A deliberately small HTTP/1.1 server on asyncio streams: one request per connection,
bounded header and body sizes, a deadline to send them, answers ``204`` (woken),
``401`` (with the rule that refused), ``405``, ``413`` or ``400``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from melchior.mellan.receiver.config import Wake
from melchior.mellan.signing import verify

MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024
DEADLINE = 10.0


class WakeError(Exception):
    """The wake listener cannot start (the address is taken, not ours, …)."""


_REASONS = {204: "No Content", 400: "Bad Request", 401: "Unauthorized",
            405: "Method Not Allowed", 413: "Content Too Large"}  # fmt: skip


def _answer(status: int, text: str = "") -> bytes:
    body = (text + "\n").encode("utf-8") if text else b""
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"content-type: text/plain; charset=utf-8\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


async def _request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes] | int:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        return 413
    except asyncio.IncompleteReadError:
        return 400
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return 400
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            return 400
        headers[name.strip().lower()] = value.strip()
    if parts[0] != "POST":
        return 405
    length_text = headers.get("content-length", "0")
    if not (length_text.isascii() and length_text.isdigit()) or len(length_text) > 7:
        return 400
    length = int(length_text)
    if length > MAX_BODY:
        return 413
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        return 400
    return parts[1], headers, body


async def serve_wake(
    wake: Wake,
    event: asyncio.Event,
    say: Callable[[str], None],
    ready: Callable[[int], None] | None = None,
) -> None:
    """Listen on ``wake.host:wake.port`` until cancelled; set ``event`` per valid wake-up."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                got = await asyncio.wait_for(_request(reader), DEADLINE)
            except TimeoutError:
                return
            if isinstance(got, int):
                writer.write(_answer(got))
                return
            _, headers, body = got
            decision = verify(wake.secret, headers, body, time.time())
            if not decision:
                say(f"wake-up refused ({decision.rule}): {decision.reason}")
                writer.write(_answer(401, f"{decision.rule}: {decision.reason}"))
                return
            event.set()
            writer.write(_answer(204))
        finally:
            with contextlib.suppress(OSError):
                await writer.drain()
                writer.close()
                await writer.wait_closed()

    try:
        server = await asyncio.start_server(handle, wake.host, wake.port, limit=MAX_HEAD)
    except OSError as exc:
        raise WakeError(f"wake.listen: cannot listen on {wake.host}:{wake.port}: {exc}") from exc
    port = server.sockets[0].getsockname()[1]
    say(f"wake webhook listening on {wake.host}:{port}")
    if ready is not None:
        ready(port)
    async with server:
        await server.serve_forever()
