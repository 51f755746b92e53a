"""Reading A2A 1.0 requests from plain JSON, refusing what is malformed with the field named.

Requests are validated here, once, for both bindings; what comes out is the caller's
own JSON (the ``message`` dict is kept as parsed, never re-modelled) plus the few
values the relay acts on. Unknown fields are ignored (spec §5.7); wrong types are
refused rather than coerced, because a relay that guesses forwards something the
caller did not send.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from melchior.a2a_message import GivenTwice, PartError, json_kind, json_named, read_part
from melchior.mellan.rawjson import whole
from melchior.mellan.relay.store.base import NewPush
from melchior.mellan.relay.surfaces.a2a.errors import InvalidParams
from melchior.mellan.relay.surfaces.a2a.timefmt import parse_ts
from melchior.policy.outbound import MAX_URL

TASK_STATES = (
    "TASK_STATE_SUBMITTED",
    "TASK_STATE_WORKING",
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_REJECTED",
    "TASK_STATE_AUTH_REQUIRED",
)
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 100
INT32_MAX = 2**31 - 1
MAX_ID = 256
"""Longest messageId, contextId, taskId or pageToken accepted (docs/a2a.md, "Limits")."""
MAX_PARTS = 512
"""Most parts one message may carry."""
MAX_LIST = 64
"""Most entries in ``extensions``, ``referenceTaskIds`` and ``acceptedOutputModes``."""
MAX_SECRET = 4096
"""Longest push ``token``, authentication ``scheme`` or ``credentials``."""


# -- ProtoJSON names: every field in lowerCamelCase or in the proto's snake_case ------------------
# (a Part's are the Part rule's: melchior.a2a_message.PART_PROTO_NAMES)

_SNAKE = (
    "message_id", "context_id", "task_id", "reference_task_ids",
    "accepted_output_modes", "history_length", "return_immediately",
    "task_push_notification_config", "page_size", "page_token",
    "status_timestamp_after", "include_artifacts", "push_notification_config",
)  # fmt: skip
CAMEL = {s: s.split("_")[0] + "".join(w.title() for w in s.split("_")[1:]) for s in _SNAKE}
"""The proto's snake_case field names and their ProtoJSON lowerCamelCase ``json_name``."""
SNAKE_OF = {c: s for s, c in CAMEL.items()}


def camel(obj: dict[str, Any], name: str) -> dict[str, Any]:
    """``obj`` with its proto fields named as ProtoJSON writes them. A parser must accept
    both spellings (ProtoJSON); giving both for one field is refused, naming it. Only the
    keys of A2A's own structures are renamed, never those inside ``data`` or ``metadata``
    (the rule is :func:`melchior.a2a_message.json_named`, a part's fields' too)."""
    try:
        return json_named(obj, CAMEL)
    except GivenTwice as exc:
        raise _bad(f"{name}.{exc.field}" if name != "params" else exc.field, exc.why) from None


def _bad(field_name: str, why: str) -> InvalidParams:
    return InvalidParams(f"{field_name}: {why}", violations=[(field_name, why)])


def _obj(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(name, f"must be an object, got {json_kind(value)}")
    return value


def _opt_obj(parent: Mapping[str, Any], key: str, name: str) -> dict[str, Any] | None:
    value = parent.get(key)
    if value is None:
        return None
    return _obj(value, name)


def _opt_str(parent: Mapping[str, Any], key: str, name: str) -> str | None:
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(name, f"must be a string, got {json_kind(value)}")
    return value


def _str_list(parent: Mapping[str, Any], key: str, name: str) -> None:
    value = parent.get(key)
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(name, "must be a list of strings")
    if len(value) > MAX_LIST or any(len(v) > 2048 for v in value):
        raise _bad(name, f"must hold at most {MAX_LIST} strings of at most 2048 characters")


def opt_int(value: Any, name: str, *, minimum: int = 0, maximum: int = INT32_MAX) -> int | None:
    """An int32 field: ProtoJSON allows numbers or decimal strings. Judged by its size
    before conversion (:func:`melchior.mellan.rawjson.whole`), so ``1e1000000`` or five
    thousand digits are refused at once, and only ASCII digits count as digits."""
    if value is None:
        return None
    try:
        return whole(value, minimum, maximum, text=True)
    except ValueError as exc:
        raise _bad(name, str(exc)) from None


def _bounded_id(parent: Mapping[str, Any], key: str, name: str) -> str | None:
    value = _opt_str(parent, key, name)
    if value is not None and len(value) > MAX_ID:
        raise _bad(name, f"must be at most {MAX_ID} characters, got {len(value)}")
    return value


def opt_bool(value: Any, name: str) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _bad(name, f"must be true or false, got {value!r}")


def check_part(part: Any, name: str) -> dict[str, Any]:
    """One Part as a ProtoJSON parser reads it (:func:`melchior.a2a_message.read_part`,
    ``wire=True``), returned with its fields named in lowerCamelCase; refused naming the
    field at fault (``message.parts[0].raw``)."""
    try:
        return read_part(part, wire=True)
    except PartError as exc:
        raise _bad(exc.path(name), exc.why) from None


def check_message(message: Any, name: str = "message") -> dict[str, Any]:
    """Validate a caller's Message; return it with its own fields (and its parts') named in
    lowerCamelCase, as it is then stored and shown (values untouched)."""
    m = camel(_obj(message, name), name)
    mid = m.get("messageId")
    if not isinstance(mid, str) or not mid:
        raise _bad(f"{name}.messageId", "is required and must be a non-empty string")
    if len(mid) > MAX_ID:
        raise _bad(f"{name}.messageId", f"must be at most {MAX_ID} characters, got {len(mid)}")
    role = m.get("role")
    if role != "ROLE_USER":
        raise _bad(
            f"{name}.role",
            f"a caller's message must have role ROLE_USER, got {role!r}",
        )
    parts = m.get("parts")
    if not isinstance(parts, list) or not parts:
        raise _bad(f"{name}.parts", "must be a non-empty list of parts")
    if len(parts) > MAX_PARTS:
        raise _bad(f"{name}.parts", f"must hold at most {MAX_PARTS} parts, got {len(parts)}")
    m["parts"] = [check_part(part, f"{name}.parts[{i}]") for i, part in enumerate(parts)]
    for key in ("taskId", "contextId"):
        value = _bounded_id(m, key, f"{name}.{key}")
        if value == "":
            m.pop(key)  # ProtoJSON clients may send empty strings for unset ids
    _opt_obj(m, "metadata", f"{name}.metadata")
    _str_list(m, "extensions", f"{name}.extensions")
    _str_list(m, "referenceTaskIds", f"{name}.referenceTaskIds")
    return m


@dataclass(frozen=True)
class SendRequest:
    message: dict[str, Any]
    return_immediately: bool = False
    history_length: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    push: NewPush | None = None
    inline: bool = True
    """The body was parsed on the event loop
    (:func:`melchior.mellan.relay.surfaces.body.parsed_inline`),
    so the door may encode the message there too; else it does so in a worker thread."""

    @property
    def task_id(self) -> str | None:
        value = self.message.get("taskId")
        return value if isinstance(value, str) and value else None

    @property
    def context_id(self) -> str | None:
        value = self.message.get("contextId")
        return value if isinstance(value, str) and value else None


def parse_send(params: Any, *, inline: bool = True) -> SendRequest:
    p = camel(_obj(params, "params"), "params")
    message = check_message(p.get("message"))
    config = camel(_opt_obj(p, "configuration", "configuration") or {}, "configuration")
    ret = opt_bool(config.get("returnImmediately"), "configuration.returnImmediately")
    hist = opt_int(config.get("historyLength"), "configuration.historyLength")
    _str_list(config, "acceptedOutputModes", "configuration.acceptedOutputModes")
    metadata = _opt_obj(p, "metadata", "metadata") or {}
    push = None
    if config.get("taskPushNotificationConfig"):
        name = "configuration.taskPushNotificationConfig"
        push = push_config(config["taskPushNotificationConfig"], name)
    return SendRequest(message, bool(ret), hist, metadata, push, inline)


def _bounded(parent: Mapping[str, Any], key: str, name: str, most: int) -> str | None:
    value = _opt_str(parent, key, name)
    if value is not None and len(value) > most:
        raise _bad(name, f"must be at most {most} characters, got {len(value)}")
    return value or None


def push_config(value: Any, name: str) -> NewPush:
    """A ``TaskPushNotificationConfig``'s endpoint and authentication (its ``taskId`` is
    read by the operation). Whether the URL may be used is the policy's to say
    (:func:`melchior.policy.outbound.check_url`), with the workspace's setting."""
    c = camel(_obj(value, name), name)
    url = _bounded(c, "url", f"{name}.url", MAX_URL)
    if url is None:
        raise _bad(f"{name}.url", "is required: where to POST the task's changes")
    auth = _opt_obj(c, "authentication", f"{name}.authentication") or {}
    scheme = _bounded(auth, "scheme", f"{name}.authentication.scheme", MAX_SECRET)
    creds = _bounded(auth, "credentials", f"{name}.authentication.credentials", MAX_SECRET)
    if creds is not None and scheme is None:
        raise _bad(f"{name}.authentication.scheme", "is required with credentials (e.g. Bearer)")
    if scheme is not None and not all(33 <= ord(ch) < 127 for ch in scheme):
        raise _bad(f"{name}.authentication.scheme", "must be a single printable ASCII word")
    for field_name, text in (("token", c.get("token")), ("authentication.credentials", creds)):
        if isinstance(text, str) and any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
            raise _bad(f"{name}.{field_name}", "must not contain control characters")
    return NewPush(
        url=url,
        id=_bounded_id(c, "id", f"{name}.id") or None,
        token=_bounded(c, "token", f"{name}.token", MAX_SECRET),
        auth_scheme=scheme,
        auth_credentials=creds,
    )


@dataclass(frozen=True)
class PushRef:
    task_id: str
    id: str


def _task_id(p: Mapping[str, Any]) -> str:
    tid = p.get("taskId")
    if not isinstance(tid, str) or not tid:
        raise _bad("taskId", "is required and must be a non-empty string")
    if len(tid) > MAX_ID:
        raise _bad("taskId", f"must be at most {MAX_ID} characters, got {len(tid)}")
    return tid


def parse_push_create(params: Any) -> tuple[str, NewPush]:
    """``CreateTaskPushNotificationConfig``: the config itself, naming its task."""
    p = camel(_obj(params, "params"), "params")
    return _task_id(p), push_config(p, "params")


def parse_push_ref(params: Any) -> PushRef:
    p = camel(_obj(params, "params"), "params")
    cid = _bounded_id(p, "id", "id")
    if not cid:
        raise _bad("id", "is required: the push notification config's id")
    return PushRef(_task_id(p), cid)


def parse_push_list(params: Any) -> tuple[str, int, str | None]:
    p = camel(_obj(params, "params"), "params")
    size = opt_int(p.get("pageSize"), "pageSize", maximum=MAX_PAGE_SIZE)
    return _task_id(p), size or DEFAULT_PAGE_SIZE, _bounded_id(p, "pageToken", "pageToken") or None


@dataclass(frozen=True)
class TaskRef:
    id: str
    history_length: int | None = None


def parse_task_ref(params: Any, *, history: bool = False) -> TaskRef:
    p = camel(_obj(params, "params"), "params")
    tid = p.get("id")
    if not isinstance(tid, str) or not tid:
        raise _bad("id", "is required and must be a non-empty string")
    if len(tid) > MAX_ID:
        raise _bad("id", f"must be at most {MAX_ID} characters, got {len(tid)}")
    hist = opt_int(p.get("historyLength"), "historyLength") if history else None
    return TaskRef(tid, hist)


@dataclass(frozen=True)
class ListRequest:
    context_id: str | None = None
    status: str | None = None
    page_size: int = DEFAULT_PAGE_SIZE
    page_token: str | None = None
    history_length: int | None = None
    status_timestamp_after: str | None = None
    include_artifacts: bool = False


def parse_list(params: Any) -> ListRequest:
    p = camel(_obj(params, "params"), "params")
    ctx = _bounded_id(p, "contextId", "contextId") or None
    status = _opt_str(p, "status", "status") or None
    if status == "TASK_STATE_UNSPECIFIED":
        status = None
    if status is not None and status not in TASK_STATES:
        raise _bad("status", f"unknown task state {status!r}")
    size = opt_int(p.get("pageSize"), "pageSize", maximum=MAX_PAGE_SIZE)
    if size is None or size == 0:
        size = DEFAULT_PAGE_SIZE
    token = _bounded_id(p, "pageToken", "pageToken") or None
    hist = opt_int(p.get("historyLength"), "historyLength")
    after = _opt_str(p, "statusTimestampAfter", "statusTimestampAfter") or None
    if after is not None:
        try:  # held as UTC: the store compares it with its own clock's values
            after = parse_ts(after).isoformat()
        except (ValueError, OverflowError):  # (a time zone can push year 1 out of range)
            raise _bad("statusTimestampAfter", f"not an ISO-8601 timestamp: {after!r}") from None
    inc = opt_bool(p.get("includeArtifacts"), "includeArtifacts")
    return ListRequest(ctx, status, size, token, hist, after, bool(inc))
