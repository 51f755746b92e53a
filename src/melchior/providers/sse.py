"""The SSE parser, as the provider clients have always imported it: :mod:`melchior.sse`.

It moved below both of its users (the provider clients and the relay client) so that
neither imports the other's package; this name stays for the code and tests that use it.
"""

from melchior.sse import (
    BOM,
    DEFAULT_MAX_EVENT,
    DEFAULT_MAX_LINE,
    RETRY_MAX_DIGITS,
    SSEDecodeError,
    SSEDecoder,
    SSEError,
    SSEEvent,
    SSELimitError,
    decode,
)

__all__ = [
    "BOM",
    "DEFAULT_MAX_EVENT",
    "DEFAULT_MAX_LINE",
    "RETRY_MAX_DIGITS",
    "SSEDecodeError",
    "SSEDecoder",
    "SSEError",
    "SSEEvent",
    "SSELimitError",
    "decode",
]
