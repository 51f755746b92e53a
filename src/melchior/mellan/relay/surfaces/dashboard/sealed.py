"""What the dashboard shows of a stored body: the text as stored, or — for a sealed task —
that it is sealed, how big, and to and from which keys; never its content.

The dashboard shows payloads exactly as stored (docs/dashboard.md), which for a sealed
task is an envelope: ciphertext in base64url, a signature, and a copy of the routing
fields. None of that is for a person to read, and a page that showed it would put the
ciphertext on a screen, in a browser's cache and in screenshots for no gain. What the
owner can use is what the relay itself knows of a sealed message (docs/security.md:
"who, to whom, which capability, when, how big"): *that* it is sealed, the fingerprints of
the keys it is sealed to and signed by — which the owner can compare with the agents'
registered keys on the Agents page — and the size of its ciphertext.

The decision is :func:`shown`, one pure function over the stored text, so that it can be
property-tested against any envelope, hostile ones included:

- The **size** said is the ciphertext's: the bytes the envelope's ``sealed`` field
  decodes to (HPKE's encapsulated key, the AEAD ciphertext and its tag: the sealed parts'
  JSON plus 48 bytes), computed from the field's length without decoding it — not the
  stored body's size, which also counts the base64url overhead, the signature and the
  routing copy. A field that is not base64url has no size (``None``).
- A **fingerprint** is said only when it is one (ten groups of four hex digits, as
  :attr:`melchior.mellan.sealing.PublicKey.fingerprint` writes it): the envelope's ``to``
  and ``from`` are the sender's words, and a sender could put anything there.
- A body **marked sealed but not well formed** (the extension declared without exactly
  one sealed part, or the other way round) is not shown either: half-sealed content
  would show the clear half.
- On a **sealed task**, a body stored in clear (a receiver that reported progress or a
  result in clear, against what our receiver does) is not shown either, only its size and
  that it was stored in clear: the page keeps its promise — a sealed task's content is
  never on it — and still shows the owner that something was sent in clear.
- Anything else is shown as stored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from melchior.mellan.sealing import FINGERPRINT, MEDIA_TYPE, SEALED_URI, SealRefused, envelope_of

_B64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")
_MAX_DEPTH = 64


@dataclass(frozen=True)
class Seal:
    """One sealed message in a body, as the dashboard may say it: the fingerprints it
    names (``None`` where the envelope's field is not a fingerprint) and the bytes of its
    ciphertext (``None`` if the field is not base64url); ``well_formed`` is False for a
    message marked sealed that carries no single envelope."""

    to: str | None
    sender: str | None
    size: int | None
    well_formed: bool = True


@dataclass(frozen=True)
class Shown:
    """What the dashboard shows of one stored body: ``text`` (the body as stored) when it
    may be shown, else ``None`` and ``why``; ``seals`` the sealed messages it carries;
    ``size`` the stored body's bytes (UTF-8)."""

    text: str | None
    seals: tuple[Seal, ...] = ()
    size: int = 0
    why: str = ""

    @property
    def sealed(self) -> bool:
        return bool(self.seals)


def fingerprint(value: object) -> str | None:
    """``value`` if it is a key fingerprint, else ``None`` (never echo a sender's text)."""
    return value if isinstance(value, str) and FINGERPRINT.fullmatch(value) else None


def ciphertext_size(value: object) -> int | None:
    """Bytes the base64url text ``value`` decodes to, from its length; ``None`` if it is
    not base64url (no bytes are decoded: the field may be megabytes)."""
    if not isinstance(value, str) or not _B64URL.fullmatch(value):
        return None
    n = len(value.rstrip("="))
    if n % 4 == 1:
        return None
    return n * 3 // 4


def _marked(value: Mapping[str, Any]) -> bool:
    ext = value.get("extensions")
    parts = value.get("parts")
    declared = isinstance(ext, list) and SEALED_URI in ext
    carried = isinstance(parts, list) and any(
        isinstance(p, Mapping) and p.get("mediaType") == MEDIA_TYPE for p in parts
    )
    return declared or carried


def _seal(message: Mapping[str, Any]) -> Seal:
    try:
        envelope = envelope_of(message)
    except SealRefused:
        return Seal(None, None, None, well_formed=False)
    assert envelope is not None  # _marked said so, and envelope_of agrees or refuses
    return Seal(
        fingerprint(envelope.get("to")),
        fingerprint(envelope.get("from")),
        ciphertext_size(envelope.get("sealed")),
    )


def seals_in(value: object) -> Iterator[Seal]:
    """The sealed messages anywhere in a parsed body (a request is one; a result, a status
    or an artifact event holds one), outermost first; a sealed message is not looked into."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > _MAX_DEPTH:
            continue
        if isinstance(item, Mapping):
            if _marked(item):
                yield _seal(item)
                continue
            stack.extend((v, depth + 1) for v in reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in reversed(item))


def _parsed(body: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(body)
    except (ValueError, RecursionError):
        return False, None


def shown(body: str, *, task_sealed: bool = False) -> Shown:
    """What the dashboard shows of ``body`` (a stored JSON text) on a task that is sealed
    (``task_sealed``) or not; see the module's docstring for the rules and why."""
    size = len(body.encode("utf-8", "surrogatepass"))
    ok, value = _parsed(body)
    if not ok:
        if task_sealed or MEDIA_TYPE in body or SEALED_URI in body:
            return Shown(None, (), size, "not JSON and not shown: the task is sealed")
        return Shown(body, (), size)
    found = tuple(seals_in(value))
    if found:
        return Shown(None, found, size, "sealed: the relay holds ciphertext only")
    if task_sealed:
        why = "stored in clear although the task is sealed; not shown here"
        return Shown(None, (), size, why)
    return Shown(body, (), size)


def request_seal(payload: str) -> Seal | None:
    """The seal of a task's request message (its stored payload), if it is sealed. A
    payload that does not mention sealing is not parsed (the task list asks this of every
    row it shows)."""
    if MEDIA_TYPE not in payload and SEALED_URI not in payload:
        return None
    ok, value = _parsed(payload)
    if not ok:
        return Seal(None, None, None, well_formed=False)
    return next(seals_in(value), None)


def task_sealed(payloads: Sequence[str]) -> bool:
    """Whether a task is sealed: any of its turns' messages (``payloads``) is."""
    return any(request_seal(p) is not None for p in payloads)
