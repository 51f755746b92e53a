"""The A2A form of the envelope: an A2A 1.0 ``Message`` to a :class:`Message` and back.

Three places meet A2A messages: the relay's entry (a caller's message becomes a task),
the receiver (a claimed task's message becomes a turn for an agent), and the ``a2a``
runtime (a turn becomes a message to a local A2A agent). They agree on one mapping,
written here: parts are carried verbatim, ``text`` is what the text parts say, the
hop budget travels as ``metadata[HOPS_URI]`` and becomes the envelope's ``chain``,
``taskId`` is what the message is ``about``, ``contextId`` its ``context``. Pure, no I/O;
errors are ``ValueError`` with a sentence, for each caller to render in its own shape.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from melchior.envelope import Message
from melchior.policy.hops import HOPS_URI, Chain, first_hop


def text_of(parts: Sequence[Any]) -> str:
    """What a message's text parts say, one per line (other parts have no text)."""
    return "\n".join(
        str(p["text"]) for p in parts if isinstance(p, Mapping) and isinstance(p.get("text"), str)
    )


PART_KINDS = ("text", "raw", "url", "data")
PART_KEYS = frozenset({*PART_KINDS, "filename", "mediaType", "metadata"})
"""What an A2A 1.0 ``Part`` is made of, in its JSON form: one kind, and what may go with it."""


def part_problem(part: Any) -> str | None:
    """Why ``part`` is not an A2A ``Part`` in its JSON form (None: it is one): an object
    of exactly one kind (``text``, ``raw`` bytes in base64, a ``url``, or ``data``, any
    JSON value) with an optional ``filename``, ``mediaType`` and ``metadata`` object,
    and nothing else."""
    if not isinstance(part, Mapping):
        return f"a part is an object, not {type(part).__name__}"
    other = sorted(str(k) for k in part if k not in PART_KEYS)
    if other:
        return f"a part has no field {other[0]!r} (it may have {', '.join(sorted(PART_KEYS))})"
    kinds = [k for k in PART_KINDS if k in part]
    if len(kinds) != 1:
        found = f" (found {', '.join(kinds)})" if kinds else ""
        return f"a part carries exactly one of text, raw, url, data{found}"
    (kind,) = kinds
    if kind != "data" and not isinstance(part[kind], str):
        return f"a part's {kind} is a string"
    if kind == "raw":
        try:
            base64.b64decode(part["raw"], validate=True)
        except (binascii.Error, ValueError):
            return "a part's raw is its bytes in base64"
    for key in ("filename", "mediaType"):
        if key in part and not isinstance(part[key], str):
            return f"a part's {key} is a string"
    if "metadata" in part and not isinstance(part["metadata"], Mapping):
        return "a part's metadata is an object"
    return None


def chain_in(sender: str, *metadatas: Mapping[str, Any] | None) -> Chain:
    """The chain of ``sender``'s message, from the first metadata that carries one; none
    means a person started it: hop 1. The sender is made the last name on the path (it is
    who sent this hop, whatever the payload claims)."""
    for md in metadatas:
        if md and HOPS_URI in md:
            raw = md[HOPS_URI]
            if not isinstance(raw, Mapping):
                raise ValueError(f"metadata[{HOPS_URI!r}] must be an object")
            try:
                chain = Chain.from_dict(dict(raw))
            except ValueError as exc:
                raise ValueError(f"metadata[{HOPS_URI!r}]: {exc}") from None
            if not chain.path or chain.path[-1] != sender:
                chain = Chain(chain.chain, chain.hop, (*chain.path, sender))
            return chain
    return first_hop(sender)


def from_a2a(
    message: Mapping[str, Any],
    *,
    sender: str,
    recipient: str,
    metadata: Mapping[str, Any] | None = None,
    sort: str = "task",
) -> Message:
    """The envelope of an A2A message ``sender`` sent ``recipient`` (``metadata``: the
    request's own, read for the hop chain after the message's)."""
    parts = message.get("parts")
    parts = tuple(parts) if isinstance(parts, list) else ()
    own = message.get("metadata")
    own = own if isinstance(own, Mapping) else None
    mid, task, ctx = message.get("messageId"), message.get("taskId"), message.get("contextId")
    return Message(
        sender=sender,
        recipient=recipient,
        text=text_of(parts),
        sort=sort,
        chain=chain_in(sender, own, metadata),
        message_id=mid if isinstance(mid, str) else None,
        about=task if isinstance(task, str) and task else None,
        context=ctx if isinstance(ctx, str) and ctx else None,
        parts=parts,
        metadata={k: v for k, v in (own or {}).items() if k != HOPS_URI} or None,
    )


def to_a2a(message: Message, *, role: str = "ROLE_USER") -> dict[str, Any]:
    """The A2A message for an envelope: its parts verbatim (or its text as one text part),
    its metadata with the hop chain, ``taskId``/``contextId`` from ``about``/``context``,
    and a fresh ``messageId`` when it has none."""
    parts = list(message.parts) if message.parts else [{"text": message.text}]
    out: dict[str, Any] = {
        "messageId": message.message_id or uuid.uuid4().hex,
        "role": role,
        "parts": parts,
    }
    metadata = dict(message.metadata or {})
    if message.chain is not None:
        metadata[HOPS_URI] = message.chain.as_dict()
    if metadata:
        out["metadata"] = metadata
    if message.about:
        out["taskId"] = message.about
    if message.context:
        out["contextId"] = message.context
    return out
