"""The two shapes every wire carries: a call that is answered, an event that is not.

A reply's ``result`` is always a list and ``n`` is its length, so a reader that
unpacks a bare value can never mistake an answer for nothing. ``family`` names the
revision a reply is written in: a reader refuses a family newer than it knows
(it cannot know what changed) and tolerates an older one (it knows what was added
since). A refused call is itself a reply, never a dropped connection.
"""

from __future__ import annotations

from melchior.wire.codec import TYPE_CHECKING, JSONObject, WireError

if TYPE_CHECKING:  # typing costs the tool's start-up; annotations only
    from collections.abc import Sequence
    from typing import Any, Literal

FAMILY = 1
"""The wire revision this code writes and the newest it can read."""

TAG = "event"
"""The one tag key for events, in both directions, on every wire."""

if TYPE_CHECKING:
    Shape = Literal["call", "reply", "event"]


def call(name: str, args: Sequence[Any] = (), *, id: str | None = None, **extra: Any) -> JSONObject:
    """Build a call. Extra keys (``from``, ``family``) ride beside ``call`` and ``args``."""
    msg: JSONObject = {"call": name, "args": list(args)}
    if id is not None:
        msg["id"] = id
    msg.update(extra)
    return msg


def event(name: str, **fields: Any) -> JSONObject:
    """Build an event; the tag comes first so captures read naturally."""
    msg: JSONObject = {TAG: name}
    msg.update(fields)
    return msg


def ok(result: Sequence[Any], *, id: Any = None) -> JSONObject:
    """A successful reply; ``result`` is always a list."""
    items = list(result)
    msg: JSONObject = {"ok": True, "family": FAMILY, "n": len(items), "result": items}
    if id is not None:
        msg["id"] = id
    return msg


def refused(reason: str, *, code: str = "refused", id: Any = None, **detail: Any) -> JSONObject:
    """A refusal is a reply with a reason a user can act on."""
    error: JSONObject = {"code": code, "reason": reason}
    error.update(detail)
    msg: JSONObject = {"ok": False, "family": FAMILY, "n": 0, "result": [], "error": error}
    if id is not None:
        msg["id"] = id
    return msg


def refusal_of(exc: WireError, *, id: Any = None) -> JSONObject:
    return refused(exc.reason, code=exc.code, id=id)


def shape(msg: JSONObject) -> Shape:
    """Say which shape a message is, or raise naming what is wrong with it."""
    has_call, has_event, has_ok = "call" in msg, TAG in msg, "ok" in msg
    if has_call + has_event + has_ok != 1:
        if has_call + has_event + has_ok == 0:
            raise WireError(
                "message is neither a call ('call'), a reply ('ok') nor an event ('event')",
                code="bad-shape",
            )
        raise WireError(
            "message mixes shapes: exactly one of 'call', 'ok' and 'event' may appear",
            code="bad-shape",
        )
    if has_call:
        if not isinstance(msg["call"], str) or not msg["call"]:
            raise WireError("'call' must be a non-empty string", code="bad-shape")
        if not isinstance(msg.get("args", []), list):
            raise WireError("'args' must be a list", code="bad-shape")
        return "call"
    if has_event:
        if not isinstance(msg[TAG], str) or not msg[TAG]:
            raise WireError("'event' must be a non-empty string", code="bad-shape")
        return "event"
    return _check_reply(msg)


def _check_reply(msg: JSONObject) -> Shape:
    if not isinstance(msg["ok"], bool):
        raise WireError("'ok' must be true or false", code="bad-shape")
    result = msg.get("result")
    if not isinstance(result, list):
        raise WireError("a reply's 'result' must be a list", code="bad-shape")
    if msg.get("n") != len(result) or isinstance(msg.get("n"), bool):
        raise WireError(
            f"a reply's 'n' must equal len(result) = {len(result)}, got {msg.get('n')!r}",
            code="bad-shape",
        )
    check_family(msg)
    if not msg["ok"]:
        err = msg.get("error")
        if not isinstance(err, dict) or not isinstance(err.get("reason"), str):
            raise WireError("a refused reply must carry error.reason", code="bad-shape")
    return "reply"


def check_family(msg: JSONObject, *, known: int = FAMILY) -> int:
    """Return the message's family; refuse one newer than ``known``, tolerate older."""
    fam = msg.get("family", known)
    if not isinstance(fam, int) or isinstance(fam, bool) or fam < 1:
        raise WireError(f"'family' must be a positive integer, got {fam!r}", code="bad-family")
    if fam > known:
        raise WireError(
            f"family {fam} is newer than this reader knows ({known}); upgrade melchior",
            code="unknown-family",
        )
    return fam


class Refused(Exception):
    """Raised by a client when the far side answered with a refusal."""

    def __init__(self, reason: str, code: str = "refused", detail: JSONObject | None = None):
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.detail = detail or {}


def unwrap(reply: JSONObject) -> list[Any]:
    """Validate a reply and return its result list, raising :class:`Refused` if refused."""
    if shape(reply) != "reply":
        raise WireError("expected a reply", code="bad-shape")
    if not reply["ok"]:
        err = reply["error"]
        detail = {k: v for k, v in err.items() if k not in ("code", "reason")}
        raise Refused(err["reason"], str(err.get("code", "refused")), detail)
    result: list[Any] = reply["result"]
    return result
