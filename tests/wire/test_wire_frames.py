"""The socket transport: length-prefixed frames, limits checked before allocation."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from melchior.wire import WireError, call, frames, ok
from melchior.wire.frames import FrameDecoder

objects = st.dictionaries(
    st.text(max_size=6),
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    max_size=5,
)


@given(st.lists(objects, max_size=5), st.data())
def test_round_trip_under_any_chunking(msgs: list[dict[str, object]], data: st.DataObject) -> None:
    stream = b"".join(frames.pack(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    dec = FrameDecoder()
    out: list[object] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        out.extend(dec.feed(stream[prev:cut]))
        prev = cut
    assert out == msgs
    assert dec.eof() is None


@settings(max_examples=300)
@given(st.binary(max_size=300), st.integers(1, 64))
def test_arbitrary_bytes_never_crash(data: bytes, limit: int) -> None:
    dec = FrameDecoder(limit=limit)
    for i in range(0, len(data), 7):
        for item in dec.feed(data[i : i + 7]):
            assert isinstance(item, dict | WireError)
    tail = dec.eof()
    assert tail is None or tail.fatal


def test_zero_length_is_fatal() -> None:
    items = list(FrameDecoder().feed(b"\x00\x00\x00\x00"))
    assert len(items) == 1
    assert isinstance(items[0], WireError)
    assert items[0].fatal


def test_length_checked_before_body_arrives() -> None:
    dec = FrameDecoder(limit=10)
    items = list(dec.feed(struct.pack(">I", 11)))  # no body sent at all
    assert isinstance(items[0], WireError)
    assert items[0].fatal
    assert "over the 10-byte" in items[0].reason
    assert dec.closed
    assert list(dec.feed(b"more")) == []


def _body_of(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes (size >= 8)."""
    return b'{"p":"' + b"x" * (size - 8) + b'"}'


def test_frame_of_exactly_the_cap_is_accepted() -> None:
    body = _body_of(64)
    items = list(FrameDecoder(limit=64).feed(struct.pack(">I", 64) + body))
    assert items == [{"p": "x" * 56}]


def test_frame_of_cap_plus_one_is_fatal() -> None:
    body = _body_of(65)
    items = list(FrameDecoder(limit=64).feed(struct.pack(">I", 65) + body))
    assert len(items) == 1
    assert isinstance(items[0], WireError)
    assert items[0].fatal


def test_bad_body_is_not_fatal_and_next_frame_reads() -> None:
    dec = FrameDecoder()
    stream = struct.pack(">I", 3) + b"{x}" + frames.pack({"event": "ok"})
    items = list(dec.feed(stream))
    assert isinstance(items[0], WireError)
    assert not items[0].fatal
    assert items[1] == {"event": "ok"}


def test_truncated_frame_is_a_clean_error() -> None:
    dec = FrameDecoder()
    packed = frames.pack(call("status"))
    assert list(dec.feed(packed[:-3])) == []
    tail = dec.eof()
    assert tail is not None
    assert tail.code == "truncated"


def test_pack_refuses_what_the_far_side_would_refuse() -> None:
    with pytest.raises(WireError, match="over the 8-byte frame limit"):
        frames.pack({"big": "x" * 10}, limit=8)


def test_env_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MELCHIOR_FRAME_LIMIT", "32")
    assert FrameDecoder().limit == 32
    monkeypatch.setenv("MELCHIOR_FRAME_LIMIT", "lots")
    with pytest.raises(ValueError, match="not a whole number"):
        FrameDecoder()


def test_blocking_socket_round_trip_and_truncation() -> None:
    a, b = socket.socketpair()
    with a, b:
        frames.send(a, call("status", id="1"))
        assert frames.recv(b) == {"call": "status", "args": [], "id": "1"}
        a.sendall(frames.pack(ok([]))[:5])
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(WireError, match="inside a frame") as info:
            frames.recv(b)
        assert info.value.fatal
        assert frames.recv(b) is None  # then clean EOF


def test_async_stream_round_trip() -> None:
    async def go() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(frames.pack(call("tell", ["hi"])) + b"\x00\x00")
        reader.feed_eof()
        assert await frames.read(reader) == {"call": "tell", "args": ["hi"]}
        with pytest.raises(WireError, match="frame header"):
            await frames.read(reader)

    asyncio.run(go())
