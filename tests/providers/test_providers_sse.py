"""The SSE byte decoder against explicit expected event lists, under every chunking.

The oracle is always a list written down by hand (or "this raises"), never the same
decoder's whole-stream parse, which could be wrong the same way. Each fixture is fed
whole, at every 2-cut (empty chunks at both ends included), at every 3-cut when small
(CR | LF and BOM byte 1 | 2 | 3 combinations), byte by byte, and in seeded random
chunkings; then a hypothesis round trip serializes arbitrary events with arbitrary line
endings, comments and chunking and reads them back.
"""

from __future__ import annotations

import codecs
import random
import zlib
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.providers.sse import (
    BOM,
    SSEDecodeError,
    SSEDecoder,
    SSEError,
    SSEEvent,
    SSELimitError,
    decode,
)

pytestmark = pytest.mark.streaming

THREE_CUT_MAX = 160
"""Fixtures up to this many bytes are also cut at every pair of offsets."""
RANDOM_CHUNKINGS = 60


def E(
    data: str, event: str = "message", id: str = "", retry: int | None = None, tail: bool = False
) -> SSEEvent:
    return SSEEvent(data, event, id, retry, tail)


Expected = list[SSEEvent] | type[SSEError]

U = "é€😀"  # 2-, 3- and 4-byte UTF-8
OPENAI = (
    b'data: {"choices":[{"delta":{"content":"\xe4\xbd\xa0\xe5\xa5\xbd"}}]}\n\n'
    b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
ANTHROPIC = (
    b"event: message_start\r\ndata: {}\r\n\r\n"
    b": ping\r\n\r\n"
    b"event: ping\r\ndata: {}\r\n\r\n"
    b'event: content_block_delta\r\ndata: {"partial_json":"{\\"q\\": \\"\xf0\x9f\x98\x80"}\r\n\r\n'
    b"event: message_stop\r\ndata: {}\r\n\r\n"
)

FIXTURES: list[tuple[str, bytes, Expected]] = [
    # endings
    ("lf", b"data: a\n\ndata: b\n\n", [E("a"), E("b")]),
    ("crlf", b"data: a\r\n\r\ndata: b\r\n\r\n", [E("a"), E("b")]),
    ("cr", b"data: a\r\rdata: b\r\r", [E("a"), E("b")]),
    ("lf-crlf", b"data: a\n\r\ndata: b\r\n\r", [E("a"), E("b")]),
    ("crlf-cr", b"data: a\r\n\rdata: b\n\r\n", [E("a"), E("b")]),
    ("multi-line", b"data: one\ndata: two\ndata:\n\n", [E("one\ntwo\n")]),
    ("many-blanks", b"\n\ndata: a\n\n\n\r\n\rdata: b\n\n\n", [E("a"), E("b")]),
    (
        "fields",
        b'event: delta\nid: 7\nretry: 1500\ndata: {"x":1}\n\ndata: again\n\n',
        [E('{"x":1}', "delta", "7", 1500), E("again", "message", "7")],
    ),
    # UTF-8
    ("utf8", f"data: {U}\n\n".encode(), [E(U)]),
    ("utf8-crlf", f"data: {U}\r\ndata: {U}\r\n\r\n".encode(), [E(f"{U}\n{U}")]),
    (
        "unicode-newlines",
        'data: {"t":"a\u2028b\u2029c\u0085d"}\n\n'.encode(),
        [E('{"t":"a\u2028b\u2029c\u0085d"}')],
    ),
    ("nel-in-name", "event: x\u0085y\ndata: 1\n\n".encode(), [E("1", "x\u0085y")]),
    # BOM
    ("bom", BOM + b"data: a\n\n", [E("a")]),
    ("bom-event", BOM + b"event: error\ndata: x\n\n", [E("x", "error")]),
    ("bom-blank-first", BOM + b"\ndata: a\n\n", [E("a")]),
    ("bom-only", BOM, []),
    ("bom-middle-kept", b"data: a\n\n" + BOM + b"data: b\n\n", [E("a")]),
    ("bom-twice", BOM + BOM + b"data: a\n\n", []),
    ("bom-in-data", "data: \ufeffx\n\n".encode(), [E("\ufeffx")]),
    # fields
    ("no-space", b"data:x\n\n", [E("x")]),
    ("two-spaces", b"data:  x\n\n", [E(" x")]),
    ("no-colon", b"data\n\n", [E("")]),
    ("empty-data-lines", b"data:\ndata\n\n", [E("\n")]),
    ("colon-in-value", b"data: a: b\n\n", [E("a: b")]),
    ("id-nul", b"id: 1\ndata: a\n\nid: a\x00b\ndata: b\n\n", [E("a", id="1"), E("b", id="1")]),
    ("id-cleared", b"id: 5\ndata: a\n\nid\ndata: b\n\n", [E("a", id="5"), E("b", id="")]),
    ("retry-bad", b"retry: 12a\ndata: a\n\nretry: \ndata: b\n\n", [E("a"), E("b")]),
    ("retry-long", b"retry: 12345678901\ndata: a\n\n", [E("a")]),
    ("retry-plain", b"retry:0\ndata: a\n\n", [E("a", retry=0)]),
    ("unknown", b"foo: bar\nDATA: no\ndata: a\n\n", [E("a")]),
    ("comment-block", b":hi\n\n: there\n\n", []),
    ("id-only-block", b"id: 5\n\n:c\n\ndata: x\n\n", [E("x", id="5")]),
    ("event-only-block", b"event: a\n\ndata: x\n\n", [E("x")]),
    ("retry-only-block", b"retry: 10\n\ndata: x\n\n", [E("x")]),
    ("event-empty", b"event\ndata: x\n\n", [E("x")]),
    ("event-reset", b"event: a\ndata: 1\n\ndata: 2\n\n", [E("1", "a"), E("2")]),
    # EOF
    ("eof-lf", b"data: 1\n\ndata: 2\n", [E("1"), E("2", tail=True)]),
    ("eof-cr", b"data: 1\n\ndata: 2\r", [E("1"), E("2", tail=True)]),
    ("eof-crlf", b"data: 1\r\n\r\ndata: 2\r\n", [E("1"), E("2", tail=True)]),
    ("eof-bare", b"data: 1\n\ndata: 2", [E("1"), E("2", tail=True)]),
    ("eof-multi", b"event: x\nid: 3\ndata: a\ndata: b", [E("a\nb", "x", "3", tail=True)]),
    ("eof-comment", b"data: 1\n\n: bye", [E("1")]),
    ("eof-id", b"data: 1\n\nid: 9", [E("1")]),
    ("eof-event-only", b"data: 1\n\nevent: x\n", [E("1")]),
    ("empty", b"", []),
    ("blank-only", b"\r\n", []),
    # malformed UTF-8: every partition raises
    ("overlong", b"data: \xc0\x80\n\n", SSEDecodeError),
    ("lone-continuation", b"data: \x80\n\n", SSEDecodeError),
    ("surrogate", b"data: \xed\xa0\x80\n\n", SSEDecodeError),
    ("above-max", b"data: \xf4\x90\x80\x80\n\n", SSEDecodeError),
    ("truncated-mid", b"data: \xe2\x82\ndata: x\n\n", SSEDecodeError),
    ("truncated-eof", b"data: ok\n\ndata: \xe2\x82", SSEDecodeError),
    ("truncated-4-eof", b"data: \xf0\x9f\x98", SSEDecodeError),
    ("bad-comment", b": \xff\n\ndata: a\n\n", SSEDecodeError),
    ("bom-truncated", b"\xef\xbbdata: a\n\n", SSEDecodeError),
    # real shapes
    (
        "openai",
        OPENAI,
        [
            E('{"choices":[{"delta":{"content":"你好"}}]}'),
            E('{"choices":[{"delta":{},"finish_reason":"stop"}]}'),
            E("[DONE]"),
        ],
    ),
    (
        "anthropic",
        ANTHROPIC,
        [
            E("{}", "message_start"),
            E("{}", "ping"),
            E('{"partial_json":"{\\"q\\": \\"😀"}', "content_block_delta"),
            E("{}", "message_stop"),
        ],
    ),
]


def run(chunks: Sequence[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    out: list[SSEEvent] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    return out + decoder.close()


def partitions(body: bytes, name: str) -> Iterator[list[bytes]]:
    n = len(body)
    yield [body]
    for i in range(n + 1):
        yield [body[:i], body[i:]]
    if n <= THREE_CUT_MAX:
        for i in range(n + 1):
            for j in range(i, n + 1):
                yield [body[:i], body[i:j], body[j:]]
    yield [body[i : i + 1] for i in range(n)]
    rng = random.Random(zlib.crc32(name.encode()))
    for _ in range(RANDOM_CHUNKINGS):
        chunks, at = [], 0
        while at < n:
            size = rng.randint(1, 8)
            chunks.append(body[at : at + size])
            at += size
        yield chunks


@pytest.mark.parametrize(("name", "body", "expected"), FIXTURES, ids=[f[0] for f in FIXTURES])
def test_every_partition_gives_the_expected_events(
    name: str, body: bytes, expected: Expected
) -> None:
    count = 0
    for chunks in partitions(body, name):
        count += 1
        assert b"".join(chunks) == body
        if isinstance(expected, list):
            assert run(chunks) == expected, chunks
        else:
            with pytest.raises(expected):
                run(chunks)
    assert count > len(body)


def test_the_fixtures_cover_every_family() -> None:
    """A cheap guard that the table keeps its partitions: 3-cuts ran on most of it."""
    small = [f for f in FIXTURES if len(f[1]) <= THREE_CUT_MAX]
    assert len(small) >= 40
    assert sum(1 for f in FIXTURES if not isinstance(f[2], list)) >= 8


def test_decode_is_feed_then_close() -> None:
    assert decode(b"data: a\n\ndata: b") == [E("a"), E("b", tail=True)]


# --- immediacy: nothing waits for bytes that are not needed ---


def test_a_cr_ended_event_is_delivered_without_further_input() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r\r") == [E("a")]


def test_a_chunk_final_cr_ends_the_line_now_and_swallows_the_next_lf() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n") == []  # the LF of CRLF, not a blank line
    assert decoder.feed(b"\r") == [E("a")]
    assert decoder.feed(b"\ndata: b\n") == []  # the swallowed LF, then a new line
    assert decoder.feed(b"\n") == [E("b")]


def test_an_lf_after_a_cr_is_swallowed_only_once() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: a\r")
    decoder.feed(b"")  # an empty chunk keeps the pending swallow
    assert decoder.feed(b"\n\n") == [E("a")]


def test_events_arrive_as_soon_as_their_blank_line_does() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: 1\n") == []
    assert decoder.feed(b"\n") == [E("1")]
    assert decoder.feed(b"data: 2\n\ndata: 3\n\ndata: 4") == [E("2"), E("3")]
    assert decoder.close() == [E("4", tail=True)]


def test_last_event_id_and_retry_are_kept_on_the_decoder() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"id: 4\nretry: 250\n\n")
    assert (decoder.last_event_id, decoder.retry) == ("4", 250)


def test_memoryview_and_bytearray_chunks_are_accepted() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(bytearray(b"data: a\n")) == []
    assert decoder.feed(memoryview(b"\n")) == [E("a")]


# --- errors poison the decoder; messages never carry the stream's bytes ---


def test_a_decode_error_names_the_line_not_its_content() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: fine\n\n")
    with pytest.raises(SSEDecodeError) as err:
        decoder.feed(b"data: secret-\xff-marker\n")
    assert "line 3" in str(err.value)
    assert "secret" not in str(err.value)
    assert "marker" not in repr(err.value)


def test_after_an_error_or_close_the_decoder_refuses_more_input() -> None:
    decoder = SSEDecoder()
    with pytest.raises(SSEDecodeError):
        decoder.feed(b"data: \xff\n")
    with pytest.raises(SSEError, match="failed"):
        decoder.feed(b"data: a\n\n")
    closed = SSEDecoder()
    closed.close()
    with pytest.raises(SSEError, match="closed"):
        closed.feed(b"data: a\n\n")
    with pytest.raises(SSEError, match="closed"):
        closed.close()


# --- limits: raise, never truncate ---


def test_a_line_exactly_at_the_cap_passes_and_one_byte_more_raises() -> None:
    at_cap = b"data: " + b"x" * 10
    assert decode(at_cap + b"\n\n", max_line=16) == [E("x" * 10)]
    with pytest.raises(SSELimitError, match="line 1 exceeds 16 bytes"):
        decode(at_cap + b"x\n\n", max_line=16)


def test_an_unterminated_line_over_the_cap_raises_before_its_end_arrives() -> None:
    decoder = SSEDecoder(max_line=16)
    decoder.feed(b"data: xxxxxxxxxx")
    with pytest.raises(SSELimitError, match="before its end"):
        decoder.feed(b"x")


def test_a_comment_line_is_capped_too() -> None:
    with pytest.raises(SSELimitError):
        decode(b":" + b"p" * 64 + b"\n", max_line=32)


def test_an_event_over_the_cap_across_many_data_lines_raises() -> None:
    line = b"data: 123456789\n"  # 15 bytes + 1 counted per line
    assert decode(line * 4 + b"\n", max_event=64) == [E("\n".join(["123456789"] * 4))]
    with pytest.raises(SSELimitError, match="event data exceeds 64 bytes"):
        decode(line * 5 + b"\n", max_event=64)


def test_the_event_budget_starts_over_after_each_dispatch() -> None:
    line = b"data: 123456789\n"
    body = (line * 4 + b"\n") * 3
    assert len(decode(body, max_event=64)) == 3


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"."):
        SSEDecoder(max_line=0)


# --- round trip: arbitrary events, endings, comments, BOM and chunking ---

_text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"), max_size=12
)
_events = st.lists(
    st.tuples(
        st.lists(_text, min_size=1, max_size=3),  # data lines
        st.none() | _text.filter(bool),  # event
        st.none() | _text.filter(lambda s: "\x00" not in s),  # id
        st.none() | st.integers(0, 10**9),  # retry
        st.lists(_text, max_size=2),  # comments
    ),
    max_size=6,
)


@given(
    events=_events,
    endings=st.lists(st.sampled_from(["\n", "\r\n", "\r"]), min_size=1, max_size=7),
    bom=st.booleans(),
    drop_final_blank=st.booleans(),
    tight=st.booleans(),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_serialized_events_come_back_identical(
    events: list[tuple[list[str], str | None, str | None, int | None, list[str]]],
    endings: list[str],
    bom: bool,
    drop_final_blank: bool,
    tight: bool,
    cuts: list[int],
) -> None:
    lines: list[str] = []
    expected: list[SSEEvent] = []
    last_id = ""
    for data, name, id_, retry, comments in events:
        lines += [f":{c}" for c in comments]
        if name is not None:
            lines.append(f"event: {name}")
        if id_ is not None:
            lines.append(f"id: {id_}")
            last_id = id_
        if retry is not None:
            lines.append(f"retry: {retry}")
        for value in data:
            no_space = tight and not value.startswith(" ")
            lines.append(f"data:{value}" if no_space else f"data: {value}")
        lines.append("")
        expected.append(E("\n".join(data), name or "message", last_id, retry))
    if drop_final_blank and lines:
        lines.pop()
        expected[-1] = expected[-1]._replace(tail=True)
    body, previous = [], ""
    for i, line in enumerate(lines):
        ending = endings[i % len(endings)]
        if previous == "\r" and not line and ending == "\n":
            ending = "\r"  # CR then an LF-ended blank line would read as one CRLF
        body.append(line + ending)
        previous = ending
    raw = (BOM if bom else b"") + "".join(body).encode()
    points = sorted({c % (len(raw) + 1) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert run(chunks) == expected


@given(events=_events.filter(bool), size=st.integers(1, 64))
def test_matches_httpx_sse_on_valid_blank_terminated_streams(
    events: list[tuple[list[str], str | None, str | None, int | None, list[str]]], size: int
) -> None:
    """A second, independent decoder agrees where both follow the spec."""
    decoders = pytest.importorskip("httpx_sse._decoders")
    text = ""
    for data, name, id_, retry, _ in events:
        if name is not None:
            text += f"event: {name}\n"
        if id_ is not None:
            text += f"id: {id_}\n"
        if retry is not None:
            text += f"retry: {retry}\n"
        text += "".join(f"data: {v}\n" for v in data) + "\n"
    raw = text.encode()
    theirs = []
    lines, sse = decoders.SSELineDecoder(), decoders.SSEDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    for at in range(0, len(raw), size):
        for line in lines.decode(utf8.decode(raw[at : at + size])):
            ev = sse.decode(line)
            if ev is not None:
                theirs.append((ev.event, ev.data, ev.id, ev.retry))
    ours = [(e.event, e.data, e.id, e.retry) for e in decode(raw)]
    assert ours == theirs
