"""The value every policy function returns."""

from __future__ import annotations

from typing import NamedTuple


class Decision(NamedTuple):
    """An allowed or refused action, with the rule that decided and why.

    ``rule`` is a short stable identifier (``project-wall``, ``hop-limit``, …) that
    scripts and audit queries match on; ``reason`` is the sentence a user reads.
    (The policy's values are NamedTuples: ``melchior tool`` is exec'd per request and
    importing dataclasses would be a fifth of its start-up.)
    """

    allowed: bool
    rule: str
    reason: str

    def __bool__(self) -> bool:
        return self.allowed


def allow(rule: str, reason: str) -> Decision:
    return Decision(True, rule, reason)


def refuse(rule: str, reason: str) -> Decision:
    return Decision(False, rule, reason)
