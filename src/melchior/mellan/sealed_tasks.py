"""Sealed tasks between our two ends: what the caller and the receiver bind, seal and open.

:mod:`melchior.mellan.sealing` is the envelope and nothing else (pure, no task in it).
This module is the agreement both our ends keep over one task, so that neither has to
trust the relay for anything but delivery:

- **A request** is bound to the fields the relay routes it by: the workspace, the caller,
  the receiver, the capability, and what the message itself says in clear (its
  ``messageId``, ``contextId``, ``taskId`` and hop chain). The receiver rebuilds that
  binding from the task the relay leased it — never from the envelope — so a payload the
  relay moved to another caller, capability or task does not open.
- **A result** is sealed back to the caller, bound to the task id and context the relay
  gave the task, and to the request's ``messageId``: a result moved to another task, or
  an earlier turn's result offered as this turn's, does not open. The artifacts travel
  inside the result's envelope (its sealed metadata), so the relay sees neither their
  names nor their count.
- **A replay** — the same sealed first message handed out again as a new task — opens
  with the same binding (a first message's task id is the relay's, made after the seal),
  so the receiver remembers which task each caller's ``messageId`` was opened for
  (:class:`Opened`) and refuses it under any other.

Keys: the agent's own pair beside its credential and the pins of others
(:mod:`melchior.mellan.keys`), both under the CLI's configuration directory
(:class:`KeyRing`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from melchior.files import atomic_write
from melchior.mellan.keys import Pins, keypair_for, keypairs, load_keypair
from melchior.mellan.sealing import (
    Binding,
    KeyPair,
    PublicKey,
    SealRefused,
    envelope_of,
    open_envelope,
    seal,
    sealed_message,
    signed_binding,
)
from melchior.policy.hops import HOPS_URI

ARTIFACTS = "artifacts"
"""The key of a result envelope's sealed metadata that carries the result's artifacts."""


class KeyRing:
    """This machine's keys, under the CLI's configuration directory: an agent's own pair
    (``agents/<id>.key``, beside its credential) and the pins of the agents it talks to."""

    def __init__(self, config_dir: Path) -> None:
        self.config_dir = config_dir
        self.pins = Pins(config_dir)

    def mine(self, agent: str) -> KeyPair:
        """``agent``'s key pair on this machine (:class:`~melchior.mellan.keys.KeyProblem`
        when it has none or it is not private)."""
        return load_keypair(self.config_dir / "agents", agent)

    def all_mine(self, agent: str) -> list[KeyPair]:
        """``agent``'s current pair, then those it rotated out and still keeps."""
        return keypairs(self.config_dir / "agents", agent)

    def pinned(self, agent: str, offered: object) -> PublicKey:
        """The key to use for ``agent``, given what the relay answered for it: pinned on
        first use, refused when it changed (:class:`~melchior.mellan.keys.KeyChanged`),
        a ``ValueError`` when the answer is not a public key."""
        text = offered.get("public_key") if isinstance(offered, Mapping) else None
        try:
            key = PublicKey.parse(text)
        except ValueError as exc:
            raise ValueError(f"the relay's answer for {agent}'s key: {exc}") from None
        return self.pins.check(agent, key)


@dataclass(frozen=True)
class SealedSend:
    """What a caller keeps of a sealed send to open its result: the request's binding,
    its own key pair and the receiver's pinned key (the result's sender)."""

    binding: Binding
    me: KeyPair
    receiver_key: PublicKey

    def result(self, task: str, context: str | None) -> Binding:
        return result_binding(self.binding, task=task, context=context)

    def shown(self) -> dict[str, Any]:
        """What a caller's JSON says of the seal (fingerprints, never keys)."""
        return {"sealed": True, "to": self.receiver_key.fingerprint,
                "from": self.me.public.fingerprint}  # fmt: skip


def _hops(message: Mapping[str, Any]) -> Mapping[str, Any] | None:
    metadata = message.get("metadata")
    hops = metadata.get(HOPS_URI) if isinstance(metadata, Mapping) else None
    return hops if isinstance(hops, Mapping) else None


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def request_binding(
    message: Mapping[str, Any], *, workspace: str, caller: str, receiver: str, capability: str
) -> Binding:
    """The fields a request message is bound to: the routing the relay holds, and what the
    message says in clear about where it belongs."""
    message_id = message.get("messageId")
    if not isinstance(message_id, str) or not message_id:
        raise SealRefused("malformed", "a sealed message has no messageId to bind")
    return Binding(
        direction="request",
        workspace=workspace,
        caller=caller,
        receiver=receiver,
        capability=capability,
        context=_text_or_none(message.get("contextId")),
        task=_text_or_none(message.get("taskId")),
        message=message_id,
        hops=_hops(message),
    )


def result_binding(request: Binding, *, task: str, context: str | None) -> Binding:
    """The fields the result of ``request`` is bound to: the task and context the relay
    gave it, and the request it answers (its ``messageId``)."""
    return Binding(
        direction="result",
        workspace=request.workspace,
        caller=request.caller,
        receiver=request.receiver,
        capability=request.capability,
        context=context or None,
        task=task,
        message=request.message,
    )


def seal_request(
    message: Mapping[str, Any],
    *,
    workspace: str,
    caller: str,
    receiver: str,
    capability: str,
    to: PublicKey,
    sender: KeyPair,
) -> tuple[dict[str, Any], Binding]:
    """``message`` (a clear A2A message) sealed to ``to``: the same ids and hop chain in
    clear, its parts and other metadata inside; and the binding used."""
    binding = request_binding(
        message, workspace=workspace, caller=caller, receiver=receiver, capability=capability
    )
    metadata = message.get("metadata")
    inner = {k: v for k, v in metadata.items() if k != HOPS_URI} if metadata else None
    envelope = seal(
        list(message.get("parts") or []),
        binding=binding,
        to=to,
        sender=sender,
        metadata=inner or None,
    )
    sealed = sealed_message(
        envelope,
        message_id=binding.message,
        context=binding.context,
        task=binding.task,
        hops=binding.hops,
    )
    return sealed, binding


def open_request(
    message: Mapping[str, Any], *, binding: Binding, me: KeyPair, sender: PublicKey
) -> dict[str, Any]:
    """The clear message a sealed request carries (its ids and hop chain as they came,
    its parts and metadata as the caller wrote them); :class:`SealRefused` if it does not
    open for ``binding``."""
    envelope = envelope_of(message)
    if envelope is None:
        raise SealRefused("malformed", "the message is not sealed")
    opened = open_envelope(envelope, binding=binding, me=me, sender=sender)
    out = {k: v for k, v in message.items() if k not in ("parts", "extensions", "metadata")}
    out["parts"] = [dict(p) for p in opened.parts]
    metadata = dict(opened.metadata or {})
    if binding.hops is not None:
        metadata[HOPS_URI] = dict(binding.hops)
    if metadata:
        out["metadata"] = metadata
    return out


def seal_result(
    text: str,
    artifacts: Sequence[Mapping[str, Any]],
    *,
    binding: Binding,
    to: PublicKey,
    sender: KeyPair,
    message_id: str,
) -> dict[str, Any]:
    """The agent's answer and artifacts as one sealed A2A message for the caller."""
    metadata = {ARTIFACTS: [dict(a) for a in artifacts]} if artifacts else None
    envelope = seal([{"text": text}], binding=binding, to=to, sender=sender, metadata=metadata)
    return sealed_message(envelope, message_id=message_id, role="ROLE_AGENT")


def open_result(
    message: Mapping[str, Any], *, binding: Binding, me: KeyPair, sender: PublicKey
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(parts, artifacts) of a sealed result; :class:`SealRefused` if it does not open."""
    envelope = envelope_of(message)
    if envelope is None:
        raise SealRefused("malformed", "the result is not sealed, and the task was")
    opened = open_envelope(envelope, binding=binding, me=me, sender=sender)
    found = (opened.metadata or {}).get(ARTIFACTS) or []
    if not isinstance(found, list) or not all(isinstance(a, dict) for a in found):
        raise SealRefused("content", "the sealed artifacts are not a list of objects")
    return [dict(p) for p in opened.parts], [dict(a) for a in found]


def sealed_request_of(task: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The caller's sealed message that ``task``'s current answer responds to (an A2A
    ``Task`` as ``GetTask`` gives it, history included): the one the sealed answer names,
    else the latest; ``None`` when the task holds no sealed request."""
    history = task.get("history")
    asked = []
    for message in history if isinstance(history, list) else []:
        if isinstance(message, Mapping) and message.get("role") == "ROLE_USER":
            try:
                if envelope_of(message) is not None:
                    asked.append(message)
            except SealRefused:
                continue
    if not asked:
        return None
    status = task.get("status")
    answer = status.get("message") if isinstance(status, Mapping) else None
    try:
        envelope = envelope_of(answer) if isinstance(answer, Mapping) else None
    except SealRefused:
        envelope = None
    bound = envelope.get("bound") if envelope else None
    named = bound.get("message") if isinstance(bound, Mapping) else None
    return next((m for m in reversed(asked) if m.get("messageId") == named), asked[-1])


def read_back(
    request: Mapping[str, Any], *, caller: str, receiver: str, keys: KeyRing
) -> SealedSend:
    """What opening a sealed task's result needs, for a caller that did not keep its send
    (reading the task later, from another process): its own request as the relay holds
    it, proved its own by its signature (with whichever of its key pairs sealed it, a
    retired one included), sealed to a key of ``receiver`` this machine pinned (now, or
    before a rotation it accepted). :class:`SealRefused` or
    :class:`~melchior.mellan.keys.KeyProblem` when it is not that."""
    envelope = envelope_of(request)
    if envelope is None:
        raise SealRefused("malformed", "the request is not sealed")
    me = keypair_for(keys.all_mine(caller), envelope.get("from"))
    to = keys.pins.known(receiver, envelope.get("to"))
    if to is None:
        raise SealRefused(
            "key", f"the request was sealed to key {envelope.get('to')!r}, which this machine "
            f"never pinned for {receiver}",
        )  # fmt: skip
    binding = signed_binding(envelope, to=to, sender=me.public)
    if (binding.direction, binding.caller, binding.receiver) != ("request", caller, receiver):
        raise SealRefused(
            "binding", f"the request was sealed from {binding.caller} to {binding.receiver}"
        )
    return SealedSend(binding, me, to)


KEEP_SECONDS = 30 * 24 * 3600.0
"""How long a receiver remembers which task a sealed message was opened for."""
MAX_REMEMBERED = 100_000


class Opened:
    """Which task (and turn) each caller's sealed ``messageId`` was opened for, kept across
    restarts, so a sealed message handed out again as another task is refused (rule
    ``replay``). The same task and turn again is a redelivery (a lease ran out, a retry),
    not a replay, and opens.

    Kept as an append-only log, one JSON line per message opened (``[key, task, turn,
    at]``), each append flushed to disk (``fdatasync``) before the turn runs: a sealed
    turn costs one small write, whatever the number remembered. Rewriting one JSON object
    per claim, as this once did, cost a write of every remembered entry per task (10 MB
    at the limit). The log is compacted — rewritten atomically with the live entries
    only — once it holds twice as many lines as entries (and at start-up, when entries
    have aged out). A file in the earlier form (one JSON object) is read as such."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._map: dict[str, tuple[str, int, float]] = {}
        self._lines = 0
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, ValueError):
            text = ""
        now = time.time()
        for key, entry in _entries(text):
            if now - entry[2] < KEEP_SECONDS:
                self._map[key] = entry
            self._lines += 1
        if len(self._map) > MAX_REMEMBERED:
            keep = sorted(self._map.items(), key=lambda kv: kv[1][2])[-MAX_REMEMBERED:]
            self._map = dict(keep)
        if self._lines > len(self._map) or text.lstrip().startswith("{"):
            self._compact()

    def claim(self, caller: str, message_id: str, task: str, turn: int) -> None:
        """Record that ``caller``'s ``message_id`` opens in ``task``'s ``turn``, or refuse
        it (:class:`SealRefused`, rule ``replay``) when it was opened for another
        (blocking: call from a thread)."""
        key = f"{caller}\n{message_id}"
        with self._lock:
            seen = self._map.get(key)
            if seen is not None and (seen[0], seen[1]) != (task, turn):
                raise SealRefused(
                    "replay",
                    f"{caller}'s sealed message {message_id!r} was opened for task {seen[0]} "
                    f"turn {seen[1]}; it arrived again as task {task} turn {turn} (replayed "
                    "by someone between the two agents)",
                )
            if seen is not None:
                return
            entry = (task, turn, time.time())
            self._append(key, entry)
            self._map[key] = entry
            if len(self._map) > MAX_REMEMBERED:
                keep = sorted(self._map.items(), key=lambda kv: kv[1][2])[-MAX_REMEMBERED:]
                self._map = dict(keep)
            if self._lines > 2 * len(self._map) + 64:
                self._compact()

    def _append(self, key: str, entry: tuple[str, int, float]) -> None:
        line = (json.dumps([key, *entry]) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, line)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        self._lines += 1

    def _compact(self) -> None:
        lines = "".join(json.dumps([k, *v]) + "\n" for k, v in self._map.items())
        atomic_write(self.path, lines.encode("utf-8"), make_parent=True)
        self._lines = len(self._map)


def _entries(text: str) -> list[tuple[str, tuple[str, int, float]]]:
    """The (key, (task, turn, at)) entries of an opened-messages file, in either form;
    what is not an entry (a torn last line, another program's bytes) is skipped."""
    if text.lstrip().startswith("{"):
        try:
            raw = json.loads(text)
        except ValueError:
            return []
        rows = (
            [[k, *v] for k, v in raw.items() if isinstance(v, list)]
            if isinstance(raw, dict)
            else []
        )
    else:
        rows = []
        for line in text.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    out = []
    for row in rows:
        if (
            isinstance(row, list)
            and len(row) == 4
            and isinstance(row[0], str)
            and isinstance(row[1], str)
            and isinstance(row[2], int)
            and isinstance(row[3], int | float)
        ):
            out.append((row[0], (row[1], row[2], float(row[3]))))
    return out
