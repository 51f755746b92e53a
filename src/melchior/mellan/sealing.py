"""Sealed messages: parts encrypted to the destination's key, bound to their routing.

Seed 002 says the relay "sees and stores accepted task payloads … not end-to-end
encrypted". A sealed message closes that for the content: the caller encrypts the parts
(and their metadata) to the receiving agent's key, the relay routes, leases, retries and
audits ciphertext, and only the receiver can read it; the result comes back the same way,
sealed to the caller. The relay still needs the routing fields, so they stay in clear and
are *bound* as associated data: a sealed payload moved to another task, caller, receiver,
capability, context or hop chain no longer opens.

**The construction, and why.** HPKE (RFC 9180) from ``cryptography``
(``cryptography.hazmat.primitives.hpke``: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
ChaCha20-Poly1305), nothing hand-rolled. That module offers HPKE's *base* mode only
(single-shot ``encrypt``/``decrypt`` with ``info``), not auth mode, so sender
authentication is an Ed25519 signature by the sender's key over the suite, both parties'
keys, the associated data and the ciphertext, checked *before* anything is decrypted. We
chose it over ``pyhpke`` (which has auth mode) because ``cryptography`` is the maintained
library the project already installs and audits; the signature gives what auth mode
would (only the holder of the sender's private key can have produced this envelope for
this recipient and these fields) and one more thing auth mode does not: it is checkable
by anyone holding the sender's public key, so the receiver refuses a forgery without
trying its private key on it. The associated data enters HPKE through ``info`` (its
SHA-256, after a label), which HPKE binds into the key schedule, so a changed field fails
decryption even if the signature check were skipped.

**What the opener trusts.** Nothing the envelope says about itself. The envelope carries
a copy of the fields it was bound to so that a refusal can name the field that differs
("sealed for task A, arrived in task B"), but the fields checked are the ones the opener
reads from the task it was handed (:class:`Binding`), the sender's key is the one the
opener pinned for the caller, and the recipient's is its own.

Pure: no I/O; refusals are :class:`SealRefused` (a ``ValueError``) naming their rule.
Keys on disk and pins live in ``mellan/keys.py``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hpke, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from melchior.policy.hops import HOPS_URI

SEALED_URI = "https://melchior.dev/ext/sealed/v1"
"""The A2A extension a sealed message declares (``Message.extensions``, the card)."""

MEDIA_TYPE = "application/vnd.melchior.sealed+json"
"""The media type of the one data part a sealed message carries."""

SUITE = "hpke-base-x25519-hkdfsha256-chacha20poly1305+ed25519"
"""What the envelope says it is; anything else is refused, never negotiated."""

VERSION = 1
PUBLIC_PREFIX = "mellan-key-v1:"
PRIVATE_PREFIX = "mellan-private-v1:"

MAX_SEALED = 32 * 1024 * 1024
"""The most ciphertext one envelope may carry, bytes (the relay's body limit is lower)."""

MAX_FIELD = 1024
"""The longest routing field bound (ids are far shorter; this bounds hostile input)."""

Direction = Literal["request", "result"]

_SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
_INFO_LABEL = b"melchior sealed v1 info\n"
_SIG_LABEL = b"melchior sealed v1 signature\n"
_ENVELOPE_KEYS = frozenset({"v", "suite", "to", "from", "bound", "sealed", "sig"})


class SealRefused(ValueError):
    """A sealed message that does not open, with the rule it broke and why."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"sealed message refused ({rule}): {reason}")
        self.rule = rule
        self.reason = reason


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: object, what: str, limit: int) -> bytes:
    if not isinstance(text, str) or len(text) > (limit * 4) // 3 + 4:
        raise SealRefused("malformed", f"{what} must be base64url text of at most {limit} bytes")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise SealRefused("malformed", f"{what} is not base64url") from None


def _canonical(value: object) -> bytes:
    """One byte string per value (sorted keys, no spaces, UTF-8): what is bound and signed."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


@dataclass(frozen=True)
class PublicKey:
    """An agent's public half: the X25519 key sealed to and the Ed25519 key it signs with."""

    box: bytes
    sign: bytes

    def __post_init__(self) -> None:
        if len(self.box) != 32 or len(self.sign) != 32:
            raise ValueError("a public key is two 32-byte keys (X25519, Ed25519)")

    def text(self) -> str:
        """The form registered with the relay and kept in pins."""
        return PUBLIC_PREFIX + _b64(self.box + self.sign)

    @classmethod
    def parse(cls, text: object) -> PublicKey:
        """The key ``text`` names; a clear ``ValueError`` for anything else."""
        if not isinstance(text, str) or not text.startswith(PUBLIC_PREFIX) or len(text) > 200:
            raise ValueError(f"a public key is {PUBLIC_PREFIX!r} and 64 bytes of base64url")
        try:
            raw = _unb64(text[len(PUBLIC_PREFIX) :], "the public key", 64)
        except SealRefused as exc:
            raise ValueError(exc.reason) from None
        if len(raw) != 64:
            raise ValueError(f"a public key is 64 bytes, this one is {len(raw)}")
        return cls(raw[:32], raw[32:])

    @property
    def fingerprint(self) -> str:
        """What a person compares: SHA-256 of both keys, 20 bytes as ten groups of hex."""
        digest = hashlib.sha256(PUBLIC_PREFIX.encode() + self.box + self.sign).hexdigest()[:40]
        return "-".join(digest[i : i + 4] for i in range(0, 40, 4))


FINGERPRINT = re.compile(r"[0-9a-f]{4}(?:-[0-9a-f]{4}){9}")
"""A key fingerprint as :attr:`PublicKey.fingerprint` writes it (ten groups of four
lowercase hex digits): the one rule for text that claims to be one."""


@dataclass(frozen=True)
class KeyPair:
    """An agent's key pair; the private half never leaves the agent's machine."""

    box: X25519PrivateKey
    signer: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> KeyPair:
        return cls(X25519PrivateKey.generate(), Ed25519PrivateKey.generate())

    @property
    def public(self) -> PublicKey:
        raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
        return PublicKey(
            self.box.public_key().public_bytes(*raw), self.signer.public_key().public_bytes(*raw)
        )

    def private_text(self) -> str:
        """The private key file's content (both seeds); keep it 0600."""
        raw = (
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return PRIVATE_PREFIX + _b64(self.box.private_bytes(*raw) + self.signer.private_bytes(*raw))

    @classmethod
    def parse(cls, text: str) -> KeyPair:
        text = text.strip()
        if not text.startswith(PRIVATE_PREFIX) or len(text) > 200:
            raise ValueError(f"a private key file holds {PRIVATE_PREFIX!r} and 64 bytes")
        try:
            raw = _unb64(text[len(PRIVATE_PREFIX) :], "the private key", 64)
        except SealRefused as exc:
            raise ValueError(exc.reason) from None
        if len(raw) != 64:
            raise ValueError(f"a private key is 64 bytes, this one is {len(raw)}")
        return cls(
            X25519PrivateKey.from_private_bytes(raw[:32]),
            Ed25519PrivateKey.from_private_bytes(raw[32:]),
        )


@dataclass(frozen=True)
class Binding:
    """The routing fields a sealed message is bound to, as the opener sees them.

    ``direction`` keeps a request from being accepted as a result (and back); ``task`` is
    ``None`` for the first message of a new task (its id is the relay's, made after the
    seal), and then ``message`` (the caller's ``messageId``, unique per caller at the relay)
    is what ties the payload to one task; ``hops`` is the message's clear
    ``metadata[HOPS_URI]`` (``None`` when a person started the chain)."""

    direction: Direction
    workspace: str
    caller: str
    receiver: str
    capability: str
    context: str | None
    task: str | None
    message: str
    hops: Mapping[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "direction": self.direction,
            "workspace": self.workspace,
            "caller": self.caller,
            "receiver": self.receiver,
            "capability": self.capability,
            "context": self.context,
            "task": self.task,
            "message": self.message,
            "hops": dict(self.hops) if self.hops is not None else None,
        }

    @classmethod
    def of(cls, bound: object) -> Binding:
        """The binding an envelope's ``bound`` copy states (:class:`SealRefused` when it is
        not one): what its signer bound, once the signature verifies."""
        names = ("workspace", "caller", "receiver", "capability", "message")
        if (
            not isinstance(bound, dict)
            or set(bound) != {"direction", *names, "context", "task", "hops"}
            or bound["direction"] not in ("request", "result")
            or not all(isinstance(bound[n], str) for n in names)
            or not all(bound[n] is None or isinstance(bound[n], str) for n in ("context", "task"))
            or not (bound["hops"] is None or isinstance(bound["hops"], dict))
        ):
            raise SealRefused("malformed", "the envelope's bound fields are not a binding")
        return cls(**bound)

    def encoded(self) -> bytes:
        for name, value in self.as_dict().items():
            if isinstance(value, str) and len(value) > MAX_FIELD:
                raise SealRefused("malformed", f"routing field {name!r} is over {MAX_FIELD} chars")
        return _canonical(self.as_dict())


@dataclass(frozen=True)
class Opened:
    """What a sealed message said: its parts and metadata, as the sender wrote them."""

    parts: tuple[Mapping[str, Any], ...]
    metadata: Mapping[str, Any] | None


def _info(ad: bytes) -> bytes:
    return _INFO_LABEL + hashlib.sha256(ad).digest()


def _signed(to: PublicKey, sender: PublicKey, ad: bytes, sealed: bytes) -> bytes:
    return b"".join(
        (
            _SIG_LABEL,
            SUITE.encode(),
            b"\n",
            to.box + to.sign,
            sender.box + sender.sign,
            hashlib.sha256(ad).digest(),
            hashlib.sha256(sealed).digest(),
        )
    )


def seal(
    parts: Sequence[Mapping[str, Any]],
    *,
    binding: Binding,
    to: PublicKey,
    sender: KeyPair,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The envelope (a JSON object) carrying ``parts`` and ``metadata`` sealed to ``to``,
    signed by ``sender``, bound to ``binding``."""
    if not parts:
        raise ValueError("a sealed message needs at least one part")
    ad = binding.encoded()
    plaintext = _canonical({"parts": [dict(p) for p in parts], "metadata": metadata})
    sealed = _SUITE.encrypt(plaintext, X25519PublicKey.from_public_bytes(to.box), info=_info(ad))
    if len(sealed) > MAX_SEALED:
        raise ValueError(f"a sealed message is at most {MAX_SEALED} bytes of ciphertext")
    me = sender.public
    sig = sender.signer.sign(_signed(to, me, ad, sealed))
    return {
        "v": VERSION,
        "suite": SUITE,
        "to": to.fingerprint,
        "from": me.fingerprint,
        "bound": binding.as_dict(),
        "sealed": _b64(sealed),
        "sig": _b64(sig),
    }


def _differences(carried: object, expected: dict[str, Any]) -> str | None:
    if not isinstance(carried, dict):
        return "the envelope's bound fields are not an object"
    for name, value in expected.items():
        if name not in carried:
            return f"the envelope names no {name!r}"
        if carried[name] != value:
            return (
                f"{name} differs: sealed for {carried[name]!r}, arrived as {value!r} "
                "(moved or replayed by someone between the two agents)"
            )
    extra = sorted(set(carried) - set(expected))
    if extra:
        return f"the envelope binds unknown fields {extra}"
    return None


def _shape(envelope: object) -> dict[str, Any]:
    """``envelope`` if it has the envelope's fields and suite; else :class:`SealRefused`."""
    if not isinstance(envelope, dict) or set(envelope) != _ENVELOPE_KEYS:
        raise SealRefused(
            "malformed", f"an envelope has exactly the fields {sorted(_ENVELOPE_KEYS)}"
        )
    if envelope["v"] != VERSION or envelope["suite"] != SUITE:
        raise SealRefused(
            "suite", f"version {envelope['v']!r}, suite {envelope['suite']!r}: only {SUITE} v1"
        )
    return envelope


def _verified(envelope: dict[str, Any], to: PublicKey, sender: PublicKey, ad: bytes) -> bytes:
    """The ciphertext of ``envelope`` once ``sender``'s signature over it, the suite, both
    keys and the associated data ``ad`` verifies; else :class:`SealRefused`."""
    sealed = _unb64(envelope["sealed"], "sealed", MAX_SEALED)
    sig = _unb64(envelope["sig"], "sig", 64)
    try:
        Ed25519PublicKey.from_public_bytes(sender.sign).verify(sig, _signed(to, sender, ad, sealed))
    except InvalidSignature:
        raise SealRefused(
            "signature", "the sender's signature does not verify: the ciphertext was altered"
        ) from None
    return sealed


def signed_binding(envelope: object, *, to: PublicKey, sender: PublicKey) -> Binding:
    """The binding ``envelope`` carries, once ``sender``'s signature proves it sealed that
    envelope to ``to`` for exactly those fields; else :class:`SealRefused`.

    For a sender reading back its *own* envelope (a caller that did not keep its send's
    binding: ``mellan`` reading a sealed task later). It cannot decrypt what it sealed to
    another key, but its signature is over the fields it bound, so the copy the envelope
    carries is its own words, whatever the relay did around it."""
    envelope = _shape(envelope)
    if envelope["to"] != to.fingerprint or envelope["from"] != sender.fingerprint:
        raise SealRefused(
            "sender",
            f"sealed by key {envelope['from']!r} to {envelope['to']!r}, not by "
            f"{sender.fingerprint} to {to.fingerprint}",
        )
    binding = Binding.of(envelope["bound"])
    _verified(envelope, to, sender, binding.encoded())
    return binding


def open_envelope(
    envelope: object,
    *,
    binding: Binding,
    me: KeyPair,
    sender: PublicKey,
) -> Opened:
    """The parts ``envelope`` seals, if it was sealed to ``me`` by ``sender`` for exactly
    ``binding``; else :class:`SealRefused` saying which check failed. The checks run
    cheapest first and nothing is decrypted before the signature verifies."""
    envelope = _shape(envelope)
    mine = me.public
    if envelope["to"] != mine.fingerprint:
        raise SealRefused(
            "recipient",
            f"sealed to key {envelope['to']!r}, this agent's key is {mine.fingerprint}",
        )
    if envelope["from"] != sender.fingerprint:
        raise SealRefused(
            "sender",
            f"signed by key {envelope['from']!r}, the caller's pinned key is {sender.fingerprint}",
        )
    ad = binding.encoded()
    differs = _differences(envelope["bound"], binding.as_dict())
    if differs:
        raise SealRefused("binding", differs)
    sealed = _verified(envelope, mine, sender, ad)
    try:
        plaintext = _SUITE.decrypt(sealed, me.box, info=_info(ad))
    except (InvalidTag, ValueError):
        raise SealRefused(
            "decrypt", "the ciphertext does not decrypt with this agent's key"
        ) from None
    try:
        inner = json.loads(plaintext.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise SealRefused("content", "the sealed content is not UTF-8 JSON") from None
    if not isinstance(inner, dict) or set(inner) != {"parts", "metadata"}:
        raise SealRefused("content", "the sealed content is not {parts, metadata}")
    parts, metadata = inner["parts"], inner["metadata"]
    if not isinstance(parts, list) or not parts or not all(isinstance(p, dict) for p in parts):
        raise SealRefused("content", "the sealed parts are not a list of objects")
    if metadata is not None and not isinstance(metadata, dict):
        raise SealRefused("content", "the sealed metadata is not an object")
    return Opened(tuple(parts), metadata)


def sealed_message(
    envelope: Mapping[str, Any],
    *,
    message_id: str,
    role: str = "ROLE_USER",
    context: str | None = None,
    task: str | None = None,
    hops: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The A2A message that carries ``envelope``: one data part of :data:`MEDIA_TYPE`,
    the extension declared, the hop chain (bound, so it must match) in clear metadata. A
    plain A2A client sees a well-formed message it cannot read."""
    out: dict[str, Any] = {
        "messageId": message_id,
        "role": role,
        "parts": [{"data": dict(envelope), "mediaType": MEDIA_TYPE}],
        "extensions": [SEALED_URI],
    }
    if hops is not None:
        out["metadata"] = {HOPS_URI: dict(hops)}
    if context:
        out["contextId"] = context
    if task:
        out["taskId"] = task
    return out


def envelope_of(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """The envelope a message carries; ``None`` if it is not sealed. A message that
    declares the extension but is not exactly one sealed part (or carries a sealed part
    among others) is refused: half-sealed content would leak or be ignored."""
    parts = message.get("parts")
    parts = parts if isinstance(parts, list) else []
    declared = SEALED_URI in (message.get("extensions") or [])
    marked = [p for p in parts if isinstance(p, Mapping) and p.get("mediaType") == MEDIA_TYPE]
    if not declared and not marked:
        return None
    if not declared or len(parts) != 1 or len(marked) != 1:
        raise SealRefused(
            "malformed",
            f"a sealed message declares {SEALED_URI} and carries exactly one "
            f"{MEDIA_TYPE} data part, nothing else",
        )
    data = marked[0].get("data")
    if not isinstance(data, dict):
        raise SealRefused("malformed", "the sealed part's data is not an object")
    return data


def is_sealed(message: Mapping[str, Any]) -> bool:
    """Whether a message says it is sealed (the admission check for a sealed grant)."""
    try:
        return envelope_of(message) is not None
    except SealRefused:
        return False
