"""The ``a2a`` runtime: forward the turn to an A2A agent on this machine (or anywhere).

This is how Hermes is reached (its A2A platform), and any other A2A 1.0 agent. It
speaks through the official ``a2a-sdk`` client, so interface selection, both HTTP
bindings, 0.3 compatibility and the wire details are the reference implementation's:

1. Read the agent card at ``card_url`` (never a guessed path) and use the interface it
   lists (``bindings`` says which ones we accept, in the agent's order).
2. Send the turn: the caller's A2A parts verbatim when the turn's envelope has them,
   else the prompt as one text part; the hop chain travels in the message metadata
   under ``https://melchior.dev/ext/hops/v1``. Every request carries
   ``A2A-Version: 1.0``, the bearer token from ``token_env`` and ``headers``.
3. With a streaming card, stream (status and artifact updates become progress); else
   send with ``returnImmediately`` and poll ``GetTask``. A stream that ends early is
   followed by polling, so a dropped connection does not lose the result.
4. Map the agent's final state: COMPLETED → completed, INPUT_REQUIRED (and
   AUTH_REQUIRED) → input_required, FAILED/REJECTED → failed, CANCELED → canceled.
   Artifacts come back as A2A artifacts.

On cancellation, ``CancelTask`` is forwarded to the agent (bounded by ``grace``) before
:class:`asyncio.CancelledError` propagates; the same happens on our own ``timeout``.

A turn's ``session`` continues the conversation: ``task:<id>`` continues a task that
asked for input (the answer goes into the same task), ``context:<id>`` (or a bare id)
sends a new message in that context. The result's ``session`` is set the same way.

``a2a-sdk`` is an optional dependency (``pip install 'melchior[a2a]'``): it brings
protobuf and gRPC tooling that nothing else in melchior needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from melchior.a2a_message import text_of, to_a2a
from melchior.envelope import Message
from melchior.policy import route_options as ro
from melchior.policy.outbound import may_carry_credential
from melchior.runtimes.base import (
    CANCELED,
    COMPLETED,
    INPUT_REQUIRED,
    Emit,
    Progress,
    RuntimeConfigError,
    Turn,
    TurnResult,
    failed,
)
from melchior.runtimes.options import OptionReader, layered
from melchior.runtimes.process import finish_despite_cancel

if TYPE_CHECKING:
    from a2a.client import Client

NAME = "a2a"
"""The hop-budget extension (the same URI the relay's A2A entry reads)."""
A2A_VERSION = "1.0"
BINDINGS = ("JSONRPC", "HTTP+JSON")
MODES = ("auto", "stream", "poll")
OPTIONS = (
    "card_url",
    "token_env",
    "headers",
    "mode",
    "bindings",
    "poll_interval",
    "timeout",
    "grace",
    "request_timeout",
    "insecure_http",
)
ROUTE_RULES: dict[str, ro.RouteOption] = {
    "card_url": ro.URL_OPTION,
    "token_env": ro.listed(),
    "headers": ro.listed(items=True),
    "mode": ro.free(),
    "bindings": ro.free(),
    "poll_interval": ro.free(),
    "timeout": ro.limit(),
    "grace": ro.limit(5.0),
    "request_timeout": ro.limit(30.0),
    "insecure_http": ro.ordered((False, True), False),
}
"""What a relay route may do with each option (:mod:`melchior.policy.route_options`): the
agent's URL only inside ``allow.urls``; which of this machine's variables holds the token
it is sent, and extra headers, only as this machine lists them."""
_FINAL = {
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_REJECTED",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_AUTH_REQUIRED",
}


def require_sdk() -> None:
    """Fail with the install command when the optional ``a2a-sdk`` is missing."""
    try:
        import a2a.client  # noqa: F401
    except ImportError:
        raise RuntimeConfigError(
            "the a2a runtime needs the a2a-sdk package: pip install 'melchior[a2a]'"
        ) from None


def check_url(url: str, *, insecure: bool, what: str) -> str | None:
    """Why ``url`` may not carry our bearer token, or None if it may. Plain http is for
    loopback only (the token would otherwise cross the network readable)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{what} {url!r} is not an http(s) URL"
    if not insecure and not may_carry_credential(url, what="the token"):
        return (
            f"{what} {url!r} is plain http to another machine; use https, or set "
            "insecure_http to send the token readable on the network"
        )
    return None


@dataclass(frozen=True)
class A2AOptions:
    card_url: str
    token_env: str | None
    headers: Mapping[str, str]
    mode: str
    bindings: tuple[str, ...]
    poll_interval: float
    timeout: float | None
    grace: float
    request_timeout: float
    insecure_http: bool

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> A2AOptions:
        r = OptionReader(NAME, raw, OPTIONS)
        bindings = r.texts("bindings") or BINDINGS
        for b in bindings:
            if b not in BINDINGS:
                raise RuntimeConfigError(
                    f"{NAME}: option bindings has {b!r}; the bindings are {', '.join(BINDINGS)}"
                )
        opts = cls(
            card_url=r.required_text("card_url"),
            token_env=r.opt_text("token_env"),
            headers=r.text_map("headers"),
            mode=r.text("mode", "auto", choices=MODES),
            bindings=bindings,
            poll_interval=r.number("poll_interval", 0.5, low=0.01, high=60.0),
            timeout=r.opt_number("timeout", low=0.001, high=7 * 24 * 3600.0),
            grace=r.number("grace", 5.0, low=0.0, high=600.0),
            request_timeout=r.number("request_timeout", 30.0, low=0.1, high=3600.0),
            insecure_http=r.flag("insecure_http", False),
        )
        why = check_url(opts.card_url, insecure=opts.insecure_http, what="card_url")
        if why:
            raise RuntimeConfigError(f"{NAME}: {why}")
        for key in opts.headers:
            if key.lower() in ("a2a-version", "content-type", "content-length"):
                raise RuntimeConfigError(f"{NAME}: option headers may not set {key}")
        return opts


def outbound_message(turn: Turn) -> dict[str, Any]:
    """The A2A ``Message`` (JSON) this turn sends: the envelope's parts verbatim, or
    the prompt as text; its metadata plus the hop chain; the session's task/context."""
    env = turn.message or Message("", "", turn.prompt)
    about, context = None, None
    if turn.session:
        kind, sep, ident = turn.session.partition(":")
        if sep and kind == "task":
            about = ident
        else:
            context = ident if sep and kind == "context" else turn.session
    parts = env.parts or ({"text": turn.prompt},)
    # a fresh messageId per forwarded turn; the rest is the one A2A form of the envelope
    return to_a2a(env._replace(parts=parts, message_id=None, about=about, context=context))


# -- following one task ----------------------------------------------------------------------------


def _to_dict(pb: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    out: dict[str, Any] = MessageToDict(pb)
    return out


class _Follow:
    """What we know of the forwarded task, updated from each stream event or poll."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.task_id: str | None = None
        self.context_id: str | None = None
        self.state: str | None = None
        self.status_message: dict[str, Any] | None = None
        self.artifacts: dict[str, dict[str, Any]] = {}
        self.reply: dict[str, Any] | None = None  # a direct Message answer, no task

    @property
    def final(self) -> bool:
        return self.reply is not None or self.state in _FINAL

    async def task(self, task: dict[str, Any]) -> None:
        self.task_id = task.get("id") or self.task_id
        self.context_id = task.get("contextId") or self.context_id
        await self._status(task.get("status") or {})
        for art in task.get("artifacts") or []:
            self.artifacts[str(art.get("artifactId"))] = art

    async def _status(self, status: dict[str, Any]) -> None:
        state = status.get("state")
        msg = status.get("message")
        if state and state != self.state:
            self.state = str(state)
            if not self.final:
                await self.emit(Progress("status", f"the agent's task is {_short(self.state)}"))
        if isinstance(msg, dict):
            self.status_message = msg
            if not self.final and text_of(msg.get("parts") or []):
                await self.emit(Progress("status", text_of(msg.get("parts") or [])))

    async def event(self, ev: dict[str, Any]) -> None:
        if "task" in ev:
            await self.task(ev["task"])
        elif "message" in ev:
            self.reply = ev["message"]
            self.context_id = self.reply.get("contextId") or self.context_id
        elif "statusUpdate" in ev:
            upd = ev["statusUpdate"]
            self.task_id = upd.get("taskId") or self.task_id
            self.context_id = upd.get("contextId") or self.context_id
            await self._status(upd.get("status") or {})
        elif "artifactUpdate" in ev:
            upd = ev["artifactUpdate"]
            self.task_id = upd.get("taskId") or self.task_id
            art = upd.get("artifact") or {}
            aid = str(art.get("artifactId"))
            append = bool(upd.get("append"))
            if append and aid in self.artifacts:
                merged = dict(self.artifacts[aid])
                merged["parts"] = [*merged.get("parts", []), *art.get("parts", [])]
                self.artifacts[aid] = merged
            else:
                self.artifacts[aid] = art
            body: dict[str, Any] = {"artifact": art}
            if append:
                body["append"] = True
            if "lastChunk" in upd:
                body["lastChunk"] = bool(upd["lastChunk"])
            await self.emit(Progress("artifact", text_of(art.get("parts") or []), body))

    def session(self) -> str | None:
        if self.state in ("TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED") and self.task_id:
            return f"task:{self.task_id}"
        return f"context:{self.context_id}" if self.context_id else None

    def result(self) -> TurnResult:
        artifacts = tuple(self.artifacts.values())
        session = self.session()
        msg = self.reply if self.reply is not None else self.status_message
        parts: list[dict[str, Any]] = list((msg or {}).get("parts") or [])
        text = text_of(parts) or "\n".join(text_of(a.get("parts") or []) for a in artifacts)
        if parts and any("text" not in p for p in parts):  # keep structure a text cannot hold
            artifacts = (*artifacts, {"artifactId": "reply", "name": "reply", "parts": parts})
        common: dict[str, Any] = {"artifacts": artifacts, "session": session, "path": "forwarded"}
        if self.reply is not None and self.task_id is None and not artifacts:
            # The agent answered with a message and no task: so does this receiver.
            return TurnResult(COMPLETED, text=text, session=session, path="forwarded", reply=True)
        if self.reply is not None or self.state == "TASK_STATE_COMPLETED":
            return TurnResult(COMPLETED, text=text, **common)
        if self.state == "TASK_STATE_INPUT_REQUIRED":
            return TurnResult(INPUT_REQUIRED, text=text, **common)
        if self.state == "TASK_STATE_AUTH_REQUIRED":
            return TurnResult(
                INPUT_REQUIRED, text=text or "the agent needs authorization to go on", **common
            )
        if self.state == "TASK_STATE_CANCELED":
            return TurnResult(CANCELED, text=text or "the agent canceled the task", **common)
        what = "rejected the task" if self.state == "TASK_STATE_REJECTED" else "failed the task"
        return failed(f"the agent {what}: {text or 'no reason given'}", text=text, **common)


def _short(state: str) -> str:
    return state.removeprefix("TASK_STATE_").lower().replace("_", " ")


# -- the runtime ---------------------------------------------------------------------------------


class _Refused(Exception):
    def __init__(self, reason: str, retryable: bool) -> None:
        super().__init__(reason)
        self.retryable = retryable


async def _fetch_card(http: httpx.AsyncClient, url: str) -> Any:
    from a2a.client.card_resolver import parse_agent_card

    try:
        response = await http.get(url)
    except httpx.HTTPError as exc:
        raise _Refused(f"cannot reach the agent card at {url}: {exc}", True) from None
    if response.status_code != 200:
        raise _Refused(
            f"the agent card at {url} answered HTTP {response.status_code}",
            response.status_code >= 500 or response.status_code == 429,
        )
    try:
        return parse_agent_card(response.json())
    except Exception as exc:
        raise _Refused(f"the agent card at {url} is not a valid agent card: {exc}", False) from None


def _describe_error(exc: BaseException) -> tuple[str, bool]:
    """A sentence for an SDK or HTTP error, and whether trying again might work."""
    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPStatusError):
        code = cause.response.status_code
        return f"the agent answered HTTP {code}", code >= 500 or code == 429
    if isinstance(cause, httpx.HTTPError) or isinstance(exc, httpx.HTTPError):
        return f"the agent could not be reached: {cause or exc}", True
    name = type(exc).__name__
    return f"the agent refused the request ({name}: {exc})", False


class A2ARuntime:
    """Forwards each turn to one A2A agent, found through its card."""

    name = NAME

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        require_sdk()
        self.config = dict(config or {})
        A2AOptions.parse(self.config)

    async def run(self, turn: Turn, emit: Emit) -> TurnResult:
        try:
            opts = A2AOptions.parse(layered(self.config, turn.options))
        except RuntimeConfigError as exc:
            return failed(str(exc), path="forwarded")
        headers = {**opts.headers, "A2A-Version": A2A_VERSION}
        if opts.token_env is not None:
            token = turn.env.get(opts.token_env) or os.environ.get(opts.token_env)
            if not token:
                return failed(
                    f"option token_env names {opts.token_env}, which is not set",
                    path="forwarded",
                )
            headers["Authorization"] = f"Bearer {token}"
        timeout = httpx.Timeout(opts.request_timeout, read=None)
        async with httpx.AsyncClient(headers=headers, timeout=timeout) as http:
            try:
                return await self._forward(turn, emit, opts, http)
            except _Refused as exc:
                return failed(str(exc), retryable=exc.retryable, path="forwarded")

    async def _forward(
        self, turn: Turn, emit: Emit, opts: A2AOptions, http: httpx.AsyncClient
    ) -> TurnResult:
        from a2a.client import ClientConfig, ClientFactory
        from a2a.types import SendMessageRequest
        from google.protobuf.json_format import ParseDict, ParseError

        card = await _fetch_card(http, opts.card_url)
        streaming = bool(card.capabilities.streaming)
        if opts.mode == "stream" and not streaming:
            raise _Refused(f"the agent card at {opts.card_url} does not offer streaming", False)
        streaming = streaming and opts.mode != "poll"
        for iface in card.supported_interfaces:
            if iface.protocol_binding in opts.bindings:
                why = check_url(iface.url, insecure=opts.insecure_http, what="the card's interface")
                if why:
                    raise _Refused(why, False)
        config = ClientConfig(
            streaming=streaming,
            polling=not streaming,
            httpx_client=http,
            supported_protocol_bindings=list(opts.bindings),
        )
        try:
            client = ClientFactory(config).create(card)
        except ValueError as exc:
            raise _Refused(
                f"the agent card offers no interface we speak ({', '.join(opts.bindings)}): {exc}",
                False,
            ) from None
        try:
            request = ParseDict({"message": outbound_message(turn)}, SendMessageRequest())
        except ParseError as exc:
            raise _Refused(f"the turn's A2A parts are not valid: {exc}", False) from None
        await emit(
            Progress(
                "status",
                f"forwarding to the A2A agent {card.name!r} "
                f"({'streaming' if streaming else 'polling'})",
                {"path": "forwarded", "agent": card.name, "card_url": opts.card_url},
            )
        )
        follow = _Follow(emit)
        try:
            async with asyncio.timeout(opts.timeout) as deadline:
                try:
                    await self._exchange(client, request, follow, opts)
                except asyncio.CancelledError:
                    if not deadline.expired():
                        await self._cancel_remote(client, follow, opts)
                    raise
        except TimeoutError:
            await self._cancel_remote(client, follow, opts)
            return failed(
                f"the agent did not finish within {opts.timeout:g} s; its task was canceled",
                session=follow.session(),
                path="forwarded",
            )
        except _Refused:
            raise
        except Exception as exc:
            reason, retryable = _describe_error(exc)
            return failed(reason, retryable=retryable and follow.task_id is None, path="forwarded")
        return follow.result()

    async def _exchange(
        self, client: Client, request: Any, follow: _Follow, opts: A2AOptions
    ) -> None:
        from a2a.types import GetTaskRequest

        stream: AsyncIterator[Any] = client.send_message(request)
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            async for ev in stream:
                await follow.event(_to_dict(ev))
                if follow.final:
                    break
        while not follow.final:
            if follow.task_id is None:
                raise _Refused("the agent answered with neither a task nor a message", False)
            await asyncio.sleep(opts.poll_interval)
            await follow.task(_to_dict(await client.get_task(GetTaskRequest(id=follow.task_id))))

    async def _cancel_remote(self, client: Client, follow: _Follow, opts: A2AOptions) -> None:
        """Forward CancelTask for a task still running, within the grace period; a
        failure to cancel must not hide why we stopped."""
        from a2a.types import CancelTaskRequest

        if follow.task_id is None or follow.final:
            return

        async def cancel() -> None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(max(opts.grace, 0.1)):
                    await client.cancel_task(CancelTaskRequest(id=follow.task_id))

        await finish_despite_cancel(cancel())
