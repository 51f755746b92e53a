"""The local layer's rules beside the walls: who may answer, report to, and end whom.

Pure, like :mod:`.walls`: values in, a :class:`~melchior.policy.Decision` out, each
naming its rule. ``melchior serve`` (the recipient) and ``melchior tool`` (the sender)
both ask these, so a refusal reads the same on either side of a socket and in a log.
"""

from __future__ import annotations

from melchior.policy.decision import Decision, allow, refuse


def callee_answers(about: str, callee: str, answerer: str) -> Decision:
    """Only the session a question was asked of may answer it."""
    if answerer != callee:
        return refuse(
            "callee-answers",
            f"{about} was asked of {callee}, not of {answerer}; only {callee} can answer",
        )
    return allow("callee-answers", f"{answerer} was asked {about}")


def answered_once(about: str, already: bool) -> Decision:
    """A question is answered once; a second answer would contradict the first unseen."""
    if already:
        return refuse("answered-once", f"{about} is already answered")
    return allow("answered-once", f"{about} has no answer yet")


def children_report(child: str, childs_parent: str | None, me: str) -> Decision:
    """A report notification comes only from a session's own child."""
    if childs_parent != me:
        return refuse(
            "children-report",
            f"{child} is not a child of {me}; only children report to a parent",
        )
    return allow("children-report", f"{child} is a child of {me}")


def token_ends(me: str, minted: bool, matches: bool) -> Decision:
    """A session ends only for the holder of the token ``melchior fork`` minted for it."""
    if not minted:
        return refuse(
            "token",
            f"{me} was not started by 'melchior fork'; only its harness can end it",
        )
    if not matches:
        return refuse(
            "token", f"that is not {me}'s token; only the session that minted it can end it"
        )
    return allow("token", f"the token {me} was started with")


def minter_ends(me: str, who: str, minted: bool) -> Decision:
    """The sender's side of :func:`token_ends`: only the minter holds the token to send."""
    if not minted:
        return refuse(
            "minter-ends",
            f"you ({me}) did not start {who}; only the session that minted a child with "
            "'melchior fork' can end it",
        )
    return allow("minter-ends", f"{me} minted {who}")
