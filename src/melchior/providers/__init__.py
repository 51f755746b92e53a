"""Talking to LLM providers: the SSE byte parser, bounded HTTP, clients, model discovery.

The client side the relay's provider adapter and the plane's provider runtime are built
on (seed 000, "Provider response boundaries" and "Model discovery"). Its rules:

- **Streams are parsed from bytes** (:mod:`.sse`): split UTF-8 and split CRLF stay
  intact, one leading BOM is accepted, blocks without ``data`` dispatch nothing,
  malformed UTF-8 fails the attempt, the last event is delivered at a *clean* end of
  body only (``tail=True``), lines and events are capped.
- **HTTP is bounded** (:mod:`.transport`): error bodies and OAuth control answers keep
  at most 64 KiB of text within a 10-second absolute deadline; successful generations
  have no total cap but a 180-second inactivity timeout that any byte resets;
  retries are bounded; cancelling closes the request.
- **Success needs the terminal event** (:mod:`.client`): ``[DONE]``, ``message_stop``,
  ``response.completed``. Anything less is a failed attempt, never partial success.
- **Diagnostics never hold secrets** (:mod:`.redact`, :mod:`.errors`): no response
  body, no userinfo, no query value, no header value in any message or ``repr``.
- **Keys stay in the environment** (:mod:`.config`): ``api_key_env`` names the
  variable; the config file and the model cache never hold a key.
- **Listings are cached 24 hours per provider** (:mod:`.discovery`); a failure keeps
  the last listing, an empty listing replaces it.

Use::

    from melchior.providers import GenerationRequest, Message, provider_for, read_providers

    config = read_providers()["work"]
    async with provider_for(config) as client:
        result = await client.generate(GenerationRequest("gpt-x", [Message("user", "hi")]))
"""

from __future__ import annotations

from melchior.providers.client import ProviderClient, generate, provider_for
from melchior.providers.config import KINDS, ConfigError, ProviderConfig, read_providers
from melchior.providers.discovery import Discovery, discover
from melchior.providers.errors import (
    ContextOverflow,
    CredentialMissing,
    HTTPStatusError,
    InactivityTimeout,
    MalformedResponse,
    MalformedStream,
    NotAStream,
    ProviderError,
    RateLimited,
    RequestRefused,
    ResponseTooLarge,
    ServerError,
    StreamError,
    TransportError,
)
from melchior.providers.sse import SSEDecoder, SSEError, SSEEvent
from melchior.providers.transport import Limits, RetryPolicy
from melchior.providers.types import (
    Done,
    Generation,
    GenerationEvent,
    GenerationRequest,
    Message,
    ModelCard,
    Restarted,
    TextDelta,
    Tool,
    ToolCall,
    Usage,
)

__all__ = [
    "KINDS",
    "ConfigError",
    "ContextOverflow",
    "CredentialMissing",
    "Discovery",
    "Done",
    "Generation",
    "GenerationEvent",
    "GenerationRequest",
    "HTTPStatusError",
    "InactivityTimeout",
    "Limits",
    "MalformedResponse",
    "MalformedStream",
    "Message",
    "ModelCard",
    "NotAStream",
    "ProviderClient",
    "ProviderConfig",
    "ProviderError",
    "RateLimited",
    "RequestRefused",
    "ResponseTooLarge",
    "Restarted",
    "RetryPolicy",
    "SSEDecoder",
    "SSEError",
    "SSEEvent",
    "ServerError",
    "StreamError",
    "TextDelta",
    "Tool",
    "ToolCall",
    "TransportError",
    "Usage",
    "discover",
    "generate",
    "provider_for",
    "read_providers",
]
