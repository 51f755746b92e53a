"""A sealed task on the receiver: opened before the adapter sees it, its report sealed back.

The relay hands a sealed task over as ciphertext. Before anything runs, the receiver
opens it with its own key (beside its credential), against the caller's key as this
machine pinned it (first use pins; a changed key is refused, as a caller refuses one),
for the routing fields of the task it was *leased* — never those the envelope names — and
only once per message (:class:`~melchior.mellan.sealed_tasks.Opened`: a replay into
another task is refused). Any check that fails fails the task, not retried and never
run, with the rule in the error the caller reads (``sealed-signature``,
``sealed-binding``, ``sealed-replay``, …): a relay that tampers learns nothing and gets
nothing done.

What opens is the caller's message, and from there it is any other task's: the adapter
reads it through :mod:`.prompt`, fenced as peer text for a model. The report goes back
sealed to the caller's key — the answer and the artifacts inside one envelope — and a
failed turn's own error text stays on this machine (it may quote the content), replaced
by a sentence saying so. Progress of a sealed turn is not sent at all: its text is
content, and the relay would store it in clear.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from melchior.mellan.client.receiver import AsyncReceiverClient, ReceiverError
from melchior.mellan.keys import KeyProblem, Pins, keypair_for, read_keypairs
from melchior.mellan.receiver.config import ReceiverConfig
from melchior.mellan.receiver.spool import Report
from melchior.mellan.sealed_tasks import (
    Opened,
    open_request,
    request_binding,
    result_binding,
    seal_result,
)
from melchior.mellan.sealing import (
    Binding,
    KeyPair,
    PublicKey,
    SealRefused,
    envelope_of,
    is_sealed,
)
from melchior.policy.decision import Decision, refuse

WITHHELD = (
    "the agent's turn failed; its error text stays on the receiver's machine because the "
    "task is sealed (the receiver's log has it)"
)


class NotOpened(Exception):
    """A sealed task the receiver will not run: the decision (its rule and why), and
    whether trying again later could help (a relay that could not be reached)."""

    def __init__(self, decision: Decision, *, retryable: bool = False) -> None:
        super().__init__(decision.reason)
        self.decision = decision
        self.retryable = retryable


@dataclass(frozen=True)
class SealedTurn:
    """An opened turn: the caller's message in clear (what the adapter reads) and what
    sealing its report needs."""

    message: dict[str, Any]
    request: Binding
    me: KeyPair
    caller_key: PublicKey

    def report(self, report: Report, task: Mapping[str, Any]) -> Report:
        """The report of the adapter's turn as it may leave this machine: a result sealed
        to the caller, a failure's own words withheld."""
        body = dict(report.body)
        if report.verb == "complete":
            result = dict(body.get("result") or {})
            message = result.get("message")
            parts = message.get("parts") if isinstance(message, Mapping) else None
            text = " ".join(str(p.get("text", "")) for p in parts or [] if isinstance(p, dict))
            context = task.get("context_id")
            binding = result_binding(
                self.request,
                task=report.task_id,
                context=context if isinstance(context, str) else None,
            )
            sealed = seal_result(
                text,
                list(result.get("artifacts") or []),
                binding=binding,
                to=self.caller_key,
                sender=self.me,
                message_id=f"{report.task_id}-t{report.turn}-result",
            )
            body["result"] = {"message": sealed, "artifacts": []}
        else:
            body["error"] = WITHHELD
        return dataclasses.replace(report, body=body)


class Unsealer:
    """Opens the sealed tasks of one receiver.

    Its own keys are read from disk once, and again when a task names a key it has not
    read (the agent rotated while the receiver ran); a task sealed to a retired key opens
    with that key, and its result is sealed with it, so a task in flight across a rotation
    completes. The caller's key is the one this machine pinned: a task signed by it opens
    without asking the relay; one signed by another key makes the receiver read the key
    the relay holds now and check it against the pin (first use pins; a change is refused
    unless the operator trusted its fingerprint)."""

    def __init__(self, config: ReceiverConfig, client: AsyncReceiverClient) -> None:
        self.config = config
        self.client = client
        state = config.state_dir
        self.opened = Opened(state / "sealed-opened.json")
        self.pins = Pins(config.pins_dir) if config.pins_dir else None
        self._pairs: list[KeyPair] = []

    async def _mine(self, fingerprint: object) -> KeyPair:
        """This agent's pair the envelope was sealed to (the current one when none is)."""
        if not any(p.public.fingerprint == fingerprint for p in self._pairs):
            if self.config.key_file is None:
                raise KeyProblem(
                    "this receiver has no key pair: its configuration takes the token from "
                    "the environment; name the agent (agent = ID, or credential = FILE) so "
                    "the key 'mellan join' made beside the credential is found"
                )
            self._pairs = await asyncio.to_thread(
                read_keypairs, self.config.key_file, self.config.name
            )
        return keypair_for(self._pairs, fingerprint)

    async def _caller_key(self, caller: str, signer: object) -> PublicKey:
        """The key to check ``caller``'s signature with: the pinned one when it signed,
        else the relay's as the pin allows (:class:`NotOpened` when it does not)."""
        if self.pins is None:
            raise NotOpened(refuse("sealed-key", "no directory to pin callers' keys in"))
        try:
            pin = await asyncio.to_thread(self.pins.get, caller)
        except KeyProblem as exc:
            raise NotOpened(refuse("sealed-key", str(exc))) from None
        if pin is not None and pin.key is not None and pin.key.fingerprint == signer:
            return pin.key
        try:
            offered = await self.client.agent_key(caller)
        except ReceiverError as exc:
            why = f"cannot read {caller}'s key from the relay to open the sealed task: {exc}"
            raise NotOpened(refuse("sealed-key", why), retryable=exc.status in (0, 503)) from None
        try:
            key = PublicKey.parse(offered.get("public_key"))
            return await asyncio.to_thread(self.pins.check, caller, key)
        except (KeyProblem, ValueError) as exc:
            raise NotOpened(refuse("sealed-key", str(exc))) from None

    async def open(self, task: Mapping[str, Any], payload: Any, turn: int) -> SealedTurn | None:
        """The opened turn of a sealed task; ``None`` for a task in clear; else
        :class:`NotOpened` naming the rule."""
        message = payload if isinstance(payload, Mapping) else {}
        try:
            envelope = envelope_of(message)
        except SealRefused as exc:
            raise NotOpened(refuse(f"sealed-{exc.rule}", exc.reason)) from None
        if envelope is None:
            return None
        caller = str(task.get("caller") or "")
        caller_key = await self._caller_key(caller, envelope.get("from"))
        try:
            me = await self._mine(envelope.get("to"))
        except KeyProblem as exc:
            raise NotOpened(refuse("sealed-key", str(exc))) from None
        tid = str(task.get("id") or "")
        try:
            binding = _binding(task, message)
            clear = open_request(message, binding=binding, me=me, sender=caller_key)
            await asyncio.to_thread(self.opened.claim, caller, binding.message, tid, turn)
        except SealRefused as exc:
            raise NotOpened(refuse(f"sealed-{exc.rule}", exc.reason)) from None
        return SealedTurn(clear, binding, me, caller_key)


def _binding(task: Mapping[str, Any], message: Mapping[str, Any]) -> Binding:
    """The binding a caller's message to ``task`` must open for: the lease's routing, and
    — when the message names a task or context in clear (a follow-up) — the lease's task
    and context, so a turn moved into another task does not open."""
    binding = request_binding(
        message,
        workspace=str(task.get("workspace") or ""),
        caller=str(task.get("caller") or ""),
        receiver=str(task.get("receiver") or ""),
        capability=str(task.get("capability") or ""),
    )
    context = task.get("context_id")
    return dataclasses.replace(
        binding,
        task=str(task.get("id") or "") if binding.task is not None else None,
        context=(context if isinstance(context, str) else "")
        if binding.context is not None
        else None,
    )


SEALED_ANSWER = "(this answer was sealed to the caller; the receiver keeps no readable copy)"


def earlier_turns(
    turn: SealedTurn, task: Mapping[str, Any], history: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any], ...]:
    """The earlier turns of a sealed task as its adapter may read them (a fresh run's
    prompt carries them): each caller message opened, bound as it was sent; each earlier
    answer — sealed to the caller, so unreadable here — replaced by a note saying so. An
    earlier message that does not open refuses the turn (:class:`NotOpened`): the relay
    may not put words in the caller's mouth in the past tense either."""
    out = []
    for item in history:
        entry = dict(item)
        message = item.get("message")
        try:
            if isinstance(message, Mapping) and envelope_of(message) is not None:
                entry["message"] = open_request(
                    message, binding=_binding(task, message), me=turn.me, sender=turn.caller_key
                )
        except SealRefused as exc:
            why = f"an earlier turn ({item.get('turn')}) does not open: {exc.reason}"
            raise NotOpened(refuse(f"sealed-{exc.rule}", why)) from None
        result = item.get("result")
        answer = result.get("message") if isinstance(result, Mapping) else None
        if isinstance(answer, Mapping) and is_sealed(answer):
            note = {"role": "ROLE_AGENT", "parts": [{"text": SEALED_ANSWER}]}
            entry["result"] = {**dict(result or {}), "message": note, "artifacts": []}
        out.append(entry)
    return tuple(out)
