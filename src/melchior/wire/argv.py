"""The argv transport: a command answers with exactly one JSON object on stdout.

For a question with an answer and nothing to hold open. A reader accepts one
object followed only by whitespace; anything else (two objects, a log line,
nothing at all) is an error naming what it found, because a script that guessed
would misread a command's failure as its answer.
"""

from __future__ import annotations

import sys

from melchior.wire.codec import TYPE_CHECKING, JSONObject, WireError, decode, encode

if TYPE_CHECKING:
    from typing import IO


def emit(msg: JSONObject, stream: IO[bytes] | None = None) -> None:
    out = stream if stream is not None else sys.stdout.buffer
    out.write(encode(msg) + b"\n")
    out.flush()


def parse(stdout: bytes) -> JSONObject:
    text = stdout.strip()
    if not text:
        raise WireError("command printed nothing; expected one JSON object", code="bad-output")
    if b"\n" in text:
        raise WireError(
            "command printed more than one line; expected exactly one JSON object",
            code="bad-output",
        )
    return decode(text)
