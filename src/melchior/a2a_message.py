"""The A2A form of the envelope: an A2A 1.0 ``Message`` to a :class:`Message` and back.

Three places meet A2A messages: the relay's entry (a caller's message becomes a task),
the receiver (a claimed task's message becomes a turn for an agent), and the ``a2a``
runtime (a turn becomes a message to a local A2A agent). They agree on one mapping,
written here: parts are carried verbatim, ``text`` is what the text parts say, the
hop budget travels as ``metadata[HOPS_URI]`` and becomes the envelope's ``chain``,
``taskId`` is what the message is ``about``, ``contextId`` its ``context``. What a part
is, is written here once too (:func:`read_part`), for the relay's door and for what a
``command`` program prints. Pure, no I/O; errors are ``ValueError`` with a sentence, for
each caller to render in its own shape.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal
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
PART_PROTO_NAMES = {"media_type": "mediaType"}
"""The Part fields whose proto name is not their JSON name (the others are one word)."""


def json_kind(value: Any) -> str:
    """What kind of JSON value ``value`` is, for a sentence saying what was found instead."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float | Decimal):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class PartError(ValueError):
    """Why a value is not an A2A ``Part``: ``field`` is the part's field at fault (its
    lowerCamelCase name; None for the part as a whole) and ``why`` completes the sentence.
    Each reader says where the part was (``message.parts[2]``, "part 2 of its stdout")."""

    def __init__(self, field: str | None, why: str) -> None:
        super().__init__(f"{field}: {why}" if field is not None else why)
        self.field = field
        self.why = why

    def path(self, where: str) -> str:
        """The field's path from ``where``, the part's own (``message.parts[0].raw``)."""
        return where if self.field is None else f"{where}.{self.field}"


def read_part(part: Any, *, wire: bool) -> dict[str, Any]:
    """``part`` as an A2A 1.0 ``Part`` in its JSON form, or :class:`PartError` naming the
    field that is not: an object of exactly one kind — ``text``, ``raw`` (bytes in base64),
    ``url`` (strings) or ``data`` (any JSON value, a ``google.protobuf.Value``) — with an
    optional ``filename`` and ``mediaType`` (strings) and ``metadata`` (an object).

    One rule, read two ways, because the two readers stand on either side of the wire:

    ``wire=True`` is what a ProtoJSON parser must accept (protobuf.dev, "ProtoJSON Format"),
    for parts that callers send the relay over any binding, written by clients we do not
    control:

    - a field by its proto name too (``media_type``): "parsers accept both the
      lowerCamelCase name … and the original proto field name"; returned renamed, as the
      relay stores and shows it; both spellings of one field is refused, naming it;
    - ``null`` for any field as its default value, i.e. absent — except ``data``, whose
      ``null`` *is* a value (``google.protobuf.Value``'s ``null_value``);
    - ``raw`` in "either standard or URL-safe base64 encoding with/without paddings"
      (one alphabet per value; padding, when given, complete);
    - fields A2A does not define are let through, untouched: the relay ignores unknown
      fields of a message the same way (spec §5.7), as the a2a-sdk's own servers do
      (``ignore_unknown_fields=True``), and gRPC's decoding drops them anyway.

    ``wire=False`` is what melchior itself emits, for a program's ``stdout = "parts"``
    (docs/runtimes.md), carried verbatim to callers as artifact parts: ProtoJSON's
    canonical output, which every client reads, however strict — lowerCamelCase only, no
    ``null`` for an absent field, ``raw`` in standard base64 with padding, and no field
    A2A does not define (a misspelt ``mimeType`` is a bug to show its author, not a field
    to carry). Every part accepted so is accepted with ``wire=True`` too.

    Values are never changed: a ``raw`` is checked, not re-encoded. Pure, no I/O.
    """
    if not isinstance(part, Mapping):
        raise PartError(None, f"must be an object, got {json_kind(part)}")
    p = part if isinstance(part, dict) else dict(part)
    if wire:
        p = _json_names(p)
    else:
        other = sorted(str(k) for k in p if k not in PART_KEYS)
        if other:
            raise PartError(other[0], f"is not a field of a part (it may have {_KEYS})")
    # ProtoJSON's null is the field's default: absent, but for data's null Value
    given = {k: v for k, v in p.items() if v is not None or k == "data"} if wire else p
    kinds = [k for k in PART_KINDS if k in given]
    if len(kinds) != 1:
        found = f" (found {', '.join(kinds)})" if kinds else ""
        raise PartError(None, f"a part carries exactly one of text, raw, url, data{found}")
    (kind,) = kinds
    if kind != "data" and not isinstance(given[kind], str):
        raise PartError(kind, f"must be a string, got {json_kind(given[kind])}")
    if kind == "raw" and not _base64(given["raw"], any_form=wire):
        raise PartError("raw", _RAW_WIRE if wire else _RAW_CANONICAL)
    for key in ("filename", "mediaType"):
        if key in given and not isinstance(given[key], str):
            raise PartError(key, f"must be a string, got {json_kind(given[key])}")
    if "metadata" in given and not isinstance(given["metadata"], Mapping):
        raise PartError("metadata", f"must be an object, got {json_kind(given['metadata'])}")
    return p


_KEYS = ", ".join(sorted(PART_KEYS))
_RAW_WIRE = "must be its bytes in base64 (standard or URL-safe alphabet, padded or not)"
_RAW_CANONICAL = "must be its bytes in standard base64 with padding, as ProtoJSON writes bytes"


class GivenTwice(ValueError):
    """One field given under both its names: ``field`` is its JSON name, ``why`` the rest
    of the sentence (each reader says where the object was)."""

    def __init__(self, field: str, proto: str) -> None:
        self.field = field
        self.why = f"given twice, as {field!r} and as {proto!r}"
        super().__init__(f"{field}: {self.why}")


def json_named(obj: dict[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """``obj`` with the fields ``names`` maps (proto name → JSON name) under their JSON
    names, the others untouched. A ProtoJSON parser must accept both spellings ("parsers
    accept both the lowerCamelCase name … and the original proto field name"); one field
    given both ways is :class:`GivenTwice`. The one rule for the relay's requests and for
    a part's fields alike; only the keys of ``obj`` itself are renamed."""
    if not any(k in names for k in obj):
        return obj
    out: dict[str, Any] = {}
    for key, value in obj.items():
        target = names.get(key, key)
        if target in out:
            proto = key if key != target else next(p for p, j in names.items() if j == target)
            raise GivenTwice(target, proto)
        out[target] = value
    return out


def _json_names(part: dict[str, Any]) -> dict[str, Any]:
    """``part`` with its proto-named fields under their JSON names (others untouched)."""
    try:
        return json_named(part, PART_PROTO_NAMES)
    except GivenTwice as exc:
        raise PartError(exc.field, exc.why) from None


def _base64(text: str, *, any_form: bool) -> bool:
    """Whether ``text`` is bytes in base64: the standard alphabet with its padding, or with
    ``any_form`` also the URL-safe one (``-_`` for ``+/``), padded or not. Not both
    alphabets in one value, nor part of the padding, nor whitespace: a lenient decoder
    guesses (Python's protobuf reads ``"QQ="`` and ``"QQ==QQ=="`` alike), a strict one
    refuses (Go's ``protojson``), and what is passed on must read the same to both."""
    if not any_form:
        if len(text) % 4:
            return False
        altchars = None
    else:
        url = "-" in text or "_" in text
        if url and ("+" in text or "/" in text):
            return False
        if "=" in text and len(text) % 4:
            return False
        altchars = b"-_" if url else None
        text += "=" * (-len(text) % 4)
    try:
        base64.b64decode(text, altchars=altchars, validate=True)
    except ValueError:  # binascii.Error, or a character past ASCII
        return False
    return True


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
