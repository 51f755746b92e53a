"""SSE parse throughput: melchior's byte decoder against httpx-sse's and the openai SDK's.

    .venv/bin/python bench/sse_parse.py [--mb 8] [--chunk 1400] [--rounds 5]

One fixture stream, built once and fed to every decoder in the same run: OpenAI-style
``chat.completion.chunk`` events (about 200 bytes each, a quarter of them carrying
multi-byte text, an SSE ``: ping`` comment every 50 events, ``[DONE]`` at the end),
cut into ``--chunk``-byte pieces the way a socket delivers them, so characters and
line endings are split across chunks. Each decoder does what it does on a real
response:

- melchior:  ``SSEDecoder.feed(chunk)`` per chunk, then ``close()``;
- httpx-sse: an incremental UTF-8 decode per chunk (what ``iter_text`` does), then its
             ``SSELineDecoder`` and ``SSEDecoder`` per line;
- openai:    ``openai._streaming.SSEDecoder.iter_bytes`` over the chunks.

All three must produce the same events (checked before timing). Rounds alternate the
decoders so load drift hits each alike; the median round counts. Prints MB/s, events/s
and melchior's speed as a ratio of each other decoder's, measured in the same run.
"""

from __future__ import annotations

import argparse
import codecs
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from melchior.providers.sse import SSEDecoder

Parsed = list[tuple[str, str]]  # (event, data)


def fixture(megabytes: float) -> tuple[bytes, int]:
    """The stream and its number of data events."""
    words = ["the ", "parser ", "is ", "done ", "東京 ", "ünïcode ", "😀 ", "ok "]
    target = int(megabytes * 1024 * 1024)
    parts: list[bytes] = []
    size = events = 0
    while size < target:
        text = "".join(words[(events + k) % len(words)] for k in range(3 if events % 4 else 5))
        chunk = {
            "id": "chatcmpl-0123456789",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "gpt-x",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        }
        line = b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"
        if events % 50 == 49:
            line += b": ping\n\n"
        parts.append(line)
        size += len(line)
        events += 1
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts), events + 1


def ours(chunks: list[bytes]) -> Parsed:
    decoder = SSEDecoder()
    out: Parsed = []
    for chunk in chunks:
        out += [(e.event, e.data) for e in decoder.feed(chunk)]
    return out + [(e.event, e.data) for e in decoder.close()]


def httpx_sse_case() -> Callable[[list[bytes]], Parsed] | None:
    try:
        from httpx_sse._decoders import SSEDecoder as TheirSSE
        from httpx_sse._decoders import SSELineDecoder
    except ImportError:
        return None

    def parse(chunks: list[bytes]) -> Parsed:
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        lines, sse = SSELineDecoder(), TheirSSE()
        out: Parsed = []
        for chunk in chunks:
            for line in lines.decode(utf8.decode(chunk)):
                event = sse.decode(line)
                if event is not None:
                    out.append((event.event, event.data))
        for line in lines.flush():
            event = sse.decode(line)
            if event is not None:
                out.append((event.event, event.data))
        return out

    return parse


def openai_case() -> Callable[[list[bytes]], Parsed] | None:
    try:
        from openai._streaming import SSEDecoder as OpenAISSE
    except ImportError:
        return None

    def parse(chunks: list[bytes]) -> Parsed:
        return [(e.event or "message", e.data) for e in OpenAISSE().iter_bytes(iter(chunks))]

    return parse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=8.0, help="fixture size in MiB")
    ap.add_argument("--chunk", type=int, default=1400, help="bytes per chunk fed")
    ap.add_argument("--rounds", type=int, default=5)
    ns = ap.parse_args()

    body, events = fixture(ns.mb)
    chunks = [body[i : i + ns.chunk] for i in range(0, len(body), ns.chunk)]
    cases: dict[str, Callable[[list[bytes]], Parsed]] = {"melchior": ours}
    for name, make in (("httpx-sse", httpx_sse_case), ("openai", openai_case)):
        case = make()
        if case is None:
            print(f"  {name}: not installed (pip install -e '.[bench]'); skipped")
        else:
            cases[name] = case

    expected = ours(chunks)
    assert len(expected) == events, (len(expected), events)
    for name, case in cases.items():
        if case(chunks) != expected:
            raise SystemExit(f"{name} parsed the fixture differently; the comparison is void")

    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(ns.rounds):
        for name, case in cases.items():
            t0 = time.perf_counter()
            case(chunks)
            seconds[name].append(time.perf_counter() - t0)

    mib = len(body) / (1024 * 1024)
    print(f"SSE parse: {mib:.1f} MiB, {events} events, {len(chunks)} chunks of {ns.chunk} B")
    print(f"  {_common.machine()}; median of {ns.rounds} alternating rounds")
    speed = {name: mib / statistics.median(s) for name, s in seconds.items()}
    print(f"  {'decoder':<10} {'MB/s':>8} {'events/s':>11}  {'melchior / this':>15}")
    for name, mbps in speed.items():
        rate = events / statistics.median(seconds[name])
        print(f"  {name:<10} {mbps:>8.1f} {rate:>11,.0f}  {speed['melchior'] / mbps:>14.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
