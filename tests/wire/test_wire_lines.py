"""The pipe transport: NDJSON split on LF bytes, overlong lines skipped, never fatal."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given
from hypothesis import strategies as st

from melchior.wire import WireError, lines
from melchior.wire.lines import LineDecoder

objects = st.dictionaries(
    st.text(max_size=6),
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    max_size=5,
)


def _all(dec: LineDecoder, chunks: list[bytes]) -> list[object]:
    out: list[object] = []
    for c in chunks:
        out.extend(dec.feed(c))
    out.extend(dec.eof())
    return out


@given(st.lists(objects, max_size=5), st.data())
def test_round_trip_under_any_chunking(msgs: list[dict[str, object]], data: st.DataObject) -> None:
    stream = b"".join(lines.pack(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    bounds = [0, *cuts, len(stream)]
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    assert _all(LineDecoder(), chunks) == msgs


def test_line_separators_inside_strings_do_not_split() -> None:
    msg = {"text": "a\u2028b\u0085c\rd\ne"}
    assert _all(LineDecoder(), [lines.pack(msg)]) == [msg]


def test_overlong_line_is_skipped_and_next_line_reads() -> None:
    dec = LineDecoder(limit=16)
    items = _all(dec, [b'{"a":"' + b"x" * 40, b'"}\n{"event":"ok"}\n'])
    assert isinstance(items[0], WireError)
    assert "over the 16-byte limit" in items[0].reason
    assert items[1] == {"event": "ok"}


def test_bad_line_names_its_number() -> None:
    items = _all(LineDecoder(), [b'{"event":"a"}\n', b"oops\n", b'{"event":"b"}'])
    assert items[0] == {"event": "a"}
    assert isinstance(items[1], WireError)
    assert items[1].reason.startswith("line 2:")
    assert items[2] == {"event": "b"}  # last line without LF still counts


def test_crlf_and_blank_lines() -> None:
    assert _all(LineDecoder(), [b'{"event":"a"}\r\n\r\n\n']) == [{"event": "a"}]


@given(st.binary(max_size=300), st.integers(1, 64))
def test_arbitrary_bytes_never_crash(data: bytes, limit: int) -> None:
    for item in _all(LineDecoder(limit=limit), [data[:50], data[50:]]):
        assert isinstance(item, dict | WireError)


def test_async_reader() -> None:
    async def go() -> list[object]:
        reader = asyncio.StreamReader()
        reader.feed_data(b'{"event":"doing","busy":true}\n{"event":"x"}')
        reader.feed_eof()
        return [m async for m in lines.aiter_messages(reader)]

    assert asyncio.run(go()) == [{"event": "doing", "busy": True}, {"event": "x"}]
