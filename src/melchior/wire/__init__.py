"""The wire: three transports (argv, pipe, socket), two shapes (call/reply, event), one
encoding (UTF-8 JSON objects). Written out once so that no two wires grow two ways
to say the same thing."""

from melchior.wire.calls import (
    FAMILY,
    TAG,
    Refused,
    call,
    check_family,
    event,
    ok,
    refusal_of,
    refused,
    shape,
    unwrap,
)
from melchior.wire.codec import JSONObject, WireError, decode, encode
from melchior.wire.limits import DEFAULT_LIMIT, frame_limit

__all__ = [
    "DEFAULT_LIMIT",
    "FAMILY",
    "TAG",
    "JSONObject",
    "Refused",
    "WireError",
    "call",
    "check_family",
    "decode",
    "encode",
    "event",
    "frame_limit",
    "ok",
    "refusal_of",
    "refused",
    "shape",
    "unwrap",
]
