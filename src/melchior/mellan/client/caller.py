"""The relay client: an agent calling other agents through the relay's A2A entry.

:class:`RelayClient` (sync, over ``httpx.Client``) and :class:`AsyncRelayClient` (async,
over ``httpx.AsyncClient``) speak A2A 1.0 HTTP+JSON to ``{relay}/a2a/{workspace}/{agent}``
(docs/a2a.md) with one agent credential: ``whoami``, ``send`` (return at once, or
``wait=True`` for the end), ``stream`` (a new task's events as they happen),
``subscribe`` (an existing task's), ``get``, ``list`` and ``cancel``. Answers are typed
views (:mod:`.views`) and the project's :class:`~melchior.envelope.Receipt`; every
refusal, failure and unusable answer is one exception,
:class:`~melchior.mellan.client.errors.RelayError`, decoded in one place.

What a hostile or broken server can do to a caller is bounded:

- an answer is read up to ``max_answer`` bytes (a larger one is refused, naming the
  limit; a declared ``Content-Length`` over it is refused before reading), within a
  ``timeout`` per call; a stream's events are parsed by the one SSE parser
  (:mod:`melchior.sse`: bytes, capped lines and events, strict UTF-8), and a
  stream that says nothing (not even its keepalive comment) for ``stream_idle`` seconds
  is broken off;
- a relay URL or TLS setting the transport rules refuse (a token over plain HTTP to
  another machine, a CA file that does not load) raises
  :class:`~melchior.mellan.transport.TransportError` when the client is made;
- JSON is read exactly and strictly (:mod:`melchior.mellan.rawjson`: no NaN, no
  duplicate keys, numbers kept as written and never converted, so a ``1e999999999``
  costs nothing), then checked (no lone surrogates, bounded nesting) before a view is
  built; a view refuses ids and states that are not strings.

The transport rules are :mod:`melchior.mellan.transport`'s: certificates verified, and
no credential over plain HTTP to a host that is not loopback. Which credential to use
is :mod:`melchior.mellan.credentials`' rule (:meth:`RelayClient.from_credentials`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import httpx

from melchior.mellan import credentials, transport
from melchior.mellan.client.errors import (
    BAD_ANSWER,
    BAD_ARGS,
    SEALED,
    UNREACHABLE,
    UNTRUSTED,
    RelayError,
    refusal,
    stream_refusal,
)
from melchior.mellan.client.views import (
    COMPLETED,
    ENDS,
    INPUT_REQUIRED,
    Identity,
    TaskEvent,
    TaskPage,
    TaskView,
)
from melchior.mellan.keys import KeyProblem
from melchior.mellan.rawjson import JSONTextError, check_request, decode, encode
from melchior.mellan.sealed_tasks import (
    KeyRing,
    SealedSend,
    open_result,
    read_back,
    seal_request,
    sealed_request_of,
)
from melchior.mellan.sealing import SEALED_URI, KeyPair, PublicKey, SealRefused
from melchior.mellan.transport import ClientTls
from melchior.sse import SSEDecoder, SSEError, SSEEvent

MAX_ANSWER = 16 * 1024 * 1024
"""Bytes of one answer (or one stream event) read before it is refused."""
TIMEOUT = 30.0
"""Seconds for one call: connecting, and between any two reads of its answer."""
STREAM_IDLE = 60.0
"""Seconds a stream may say nothing; the relay sends a keepalive every 15 s."""
MAX_AGENT_ID = 256

_HEADERS = {"A2A-Version": "1.0", "Accept": "application/json"}

OnEvent = Callable[[TaskEvent], None]
AsyncOnEvent = Callable[[TaskEvent], Awaitable[None]]


def _bad(what: str) -> RelayError:
    return RelayError(f"the relay's answer is not usable: {what}", code=BAD_ANSWER, said=False)


def _json(content: bytes, what: str) -> Any:
    """Strict, exact JSON that is fit to carry (no lone surrogates, bounded nesting)."""
    try:
        value = decode(content)
        check_request(value)
    except UnicodeDecodeError:
        raise _bad(f"{what} is not UTF-8") from None
    except JSONTextError as exc:
        raise _bad(f"{what}: {exc}") from None
    except ValueError as exc:
        raise _bad(f"{what} is not JSON ({exc})") from None
    except RecursionError:  # nested past what the parser can follow: refused, not a crash
        raise _bad(f"{what} is nested too deeply") from None
    return value


def _too_big(limit: int) -> RelayError:
    return _bad(f"the answer exceeds {limit} bytes")


def _declared_over(response: httpx.Response, limit: int) -> bool:
    length = response.headers.get("content-length", "")
    return length.isascii() and length.isdigit() and (len(length) > 15 or int(length) > limit)


def _event(ev: SSEEvent) -> TaskEvent:
    raw = _json(ev.data.encode("utf-8", "surrogatepass"), "a stream event")
    if ev.event == "error" or (isinstance(raw, dict) and "error" in raw):
        raise stream_refusal(raw, ev.data)
    return TaskEvent.of(raw, ev.data)


class _Calls:
    """What both clients share: the URLs, the bodies, how answers become views."""

    def __init__(
        self,
        relay: str,
        token: str,
        *,
        workspace: str | None = None,
        tls: ClientTls | None = None,
        timeout: float = TIMEOUT,
        stream_idle: float = STREAM_IDLE,
        max_answer: int = MAX_ANSWER,
        keys: KeyRing | None = None,
    ) -> None:
        self.relay = relay.rstrip("/")
        self.keys = keys
        """This machine's keys for sealed sends (default: the CLI's configuration
        directory, where 'mellan join' put the agent's key pair and pins live)."""
        self._mine: dict[str, KeyPair] = {}
        self._checked: dict[str, PublicKey] = {}
        self.token = token
        self.tls = tls
        self.timeout = timeout
        self.stream_idle = stream_idle
        self.max_answer = max_answer
        self._workspace = workspace
        self._identity: Identity | None = None
        self.http = self._connect(self._options())

    def _connect(self, options: dict[str, Any]) -> Any:
        raise NotImplementedError

    @classmethod
    def from_credentials(
        cls,
        *,
        as_agent: str | None = None,
        relay: str | None = None,
        ca_file: str | Path | None = None,
        environ: Mapping[str, str] | None = None,
        **options: Any,
    ) -> Self:
        """The agent credential :func:`melchior.mellan.credentials.agent_credential`
        picks (raises :class:`~melchior.mellan.credentials.CredentialError`)."""
        found = credentials.agent_credential(
            as_agent=as_agent, relay=relay, ca_file=ca_file, environ=environ
        )
        return cls(found.relay, found.token, workspace=found.workspace, tls=found.tls, **options)

    def _limit(self, response: httpx.Response) -> bytearray:
        """A buffer for an answer, refused at once when it says it is over the limit."""
        if _declared_over(response, self.max_answer):
            raise _too_big(self.max_answer)
        return bytearray()

    def _more(self, got: bytearray, chunk: bytes) -> None:
        got += chunk
        if len(got) > self.max_answer:
            raise _too_big(self.max_answer)

    @staticmethod
    def _request(body: Any) -> tuple[bytes | None, dict[str, str] | None]:
        if body is None:
            return None, None
        return encode(body).encode("utf-8"), {"Content-Type": "application/json"}

    @staticmethod
    def _answer(r: httpx.Response, data: bytes, where: str) -> tuple[Any, str]:
        """A whole answer: decoded with its exact text, or the refusal it is."""
        if not r.is_success:
            raise refusal(r.status_code, data, r.headers, where)
        text = data.decode("utf-8", "replace")
        return (_json(data, f"the answer to {where}") if data else {}), text

    def _stream_request(self, body: Any) -> dict[str, Any]:
        return {
            "content": encode(body).encode("utf-8"),
            "headers": {"Content-Type": "application/json", "Accept": "text/event-stream"},
            "timeout": httpx.Timeout(self.timeout, read=self.stream_idle),
        }

    def _options(self) -> dict[str, Any]:
        """The httpx client's options, by the transport's rules: a URL or TLS setting this
        client will not use raises :class:`~melchior.mellan.transport.TransportError` (a
        ValueError) before anything is sent — no relay said anything yet."""
        options = transport.client_options(self.relay, self.token, self.tls)
        options["headers"] = {**options.get("headers", {}), **_HEADERS}
        options["timeout"] = httpx.Timeout(self.timeout)
        return options

    def _unreachable(self, exc: BaseException) -> RelayError:
        untrusted = transport.untrusted(exc)
        if untrusted:
            return RelayError(f"{self.relay}: {untrusted}", code=UNTRUSTED, said=False)
        if isinstance(exc, TimeoutError | httpx.TimeoutException):
            said = f"the relay at {self.relay} did not answer within {self.timeout:g} s"
        else:
            said = f"cannot reach the relay at {self.relay}: {exc or type(exc).__name__}"
        return RelayError(said, code=UNREACHABLE, said=False)

    def _base(self, workspace: str, agent: str) -> str:
        if (
            not isinstance(agent, str)
            or not agent
            or len(agent) > MAX_AGENT_ID
            or any(not c.isprintable() or c.isspace() for c in agent)
        ):
            raise RelayError(f"{agent!r} is not an agent id", code=BAD_ARGS, said=False)
        return f"{self.relay}/a2a/{quote(workspace, safe='')}/{quote(agent, safe='/')}"

    @staticmethod
    def _task_path(task_id: str, verb: str = "") -> str:
        if not isinstance(task_id, str) or not task_id:
            raise RelayError(f"{task_id!r} is not a task id", code=BAD_ARGS, said=False)
        return f"/tasks/{quote(task_id, safe='')}" + (f":{verb}" if verb else "")

    @staticmethod
    def message_body(
        text: str,
        *,
        capability: str | None = None,
        task: str | None = None,
        context: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A ``SendMessageRequest``: one text part, continuing ``task`` (one that asked for
        input) or ``context``; ``metadata`` on the message (the hop chain travels there),
        ``capability`` on the request."""
        message: dict[str, Any] = {
            "messageId": secrets.token_hex(16),
            "role": "ROLE_USER",
            "parts": [{"text": text}],
        }
        if metadata:
            message["metadata"] = dict(metadata)
        if task:
            message["taskId"] = task
        if context:
            message["contextId"] = context
        body: dict[str, Any] = {"message": message}
        if capability:
            body["metadata"] = {"capability": capability}
        return body

    def _key_url(self, agent: str) -> str | None:
        """Where ``agent``'s key is read, or ``None`` when this client already checked it
        against the pin: a client seals to the key it checked first for its whole life
        (a key the relay changes meanwhile is caught by the next client's check)."""
        return None if agent in self._checked else f"{self.relay}/api/keys/{quote(agent, safe='/')}"

    def _seal(
        self, body: dict[str, Any], *, workspace: str, caller: str, agent: str, offered: Any
    ) -> SealedSend:
        """Seal ``body``'s message in place to ``agent``'s key (``offered``: what the relay
        answered for it, checked against this machine's pin; ``None``: the key this client
        checked before) and say how to open the result. Refused before anything is sent
        when a key is missing or changed."""
        metadata = body.get("metadata")
        capability = metadata.get("capability") if isinstance(metadata, dict) else None
        if not isinstance(capability, str) or not capability:
            raise RelayError(
                "a sealed send names its capability (--capability CAP): the seal is bound "
                "to it, so the relay cannot choose one", code=BAD_ARGS, said=False,
            )  # fmt: skip
        keys = self._keyring()
        try:
            me = self._mine[caller] if caller in self._mine else keys.mine(caller)
            to = self._checked[agent] if offered is None else keys.pinned(agent, offered)
        except (KeyProblem, ValueError) as exc:
            raise RelayError(f"not sealed, so not sent: {exc}", code=SEALED, said=False) from None
        self._mine[caller], self._checked[agent] = me, to
        body["message"], binding = seal_request(
            body["message"], workspace=workspace, caller=caller, receiver=agent,
            capability=capability, to=to, sender=me,
        )  # fmt: skip
        return SealedSend(binding, me, to)

    @staticmethod
    def _marked(view: TaskView, sealed: SealedSend, *, whole: bool) -> TaskView:
        """``view`` saying it was sealed (its metadata names the extension and the
        fingerprints), carrying the keys that open its result."""
        raw = dict(view.raw)
        raw["metadata"] = {**dict(raw.get("metadata") or {}), SEALED_URI: sealed.shown()}
        text = encode({"task": raw} if whole else raw)
        return dataclasses.replace(TaskView.of(raw, text), seal=sealed)

    @staticmethod
    def _open_answer(
        message: object, sealed: SealedSend, task: str, context: str | None
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The sealed answer ``message`` of ``task`` opened: (the message with its parts in
        clear, the artifacts it carried). A result that does not open — or that came back
        in clear — is refused, not shown: the relay could have written it."""
        try:
            if not isinstance(message, dict):
                raise SealRefused("malformed", "the task was sealed and its result has no message")
            parts, artifacts = open_result(
                message, binding=sealed.result(task, context or None), me=sealed.me,
                sender=sealed.receiver_key,
            )  # fmt: skip
        except SealRefused as exc:
            raise RelayError(
                f"the result of task {task} is not trusted: {exc}", code=SEALED, said=False
            ) from None
        kept = {k: v for k, v in message.items() if k not in ("parts", "extensions")}
        return {**kept, "parts": parts}, artifacts

    @classmethod
    def _opened(cls, view: TaskView, sealed: SealedSend) -> TaskView:
        """The task with its sealed result opened (completed or asking back); any other
        state carries no result."""
        if view.state not in (COMPLETED, INPUT_REQUIRED):
            return cls._marked(view, sealed, whole=False)
        raw = dict(view.raw)
        status = dict(raw.get("status") or {})
        status["message"], raw["artifacts"] = cls._open_answer(
            status.get("message"), sealed, view.id, view.context_id
        )
        raw["status"] = status
        meta = {**sealed.shown(), "opened": True}
        raw["metadata"] = {**dict(raw.get("metadata") or {}), SEALED_URI: meta}
        return dataclasses.replace(TaskView.of(raw, encode(raw)), seal=sealed)

    @classmethod
    def _sealed_events(
        cls, event: TaskEvent, sealed: SealedSend, task: dict[str, str]
    ) -> list[TaskEvent]:
        """What a sealed stream tells for one event from the relay: the task marked
        sealed (and remembered in ``task``: its id and context bind the result); state
        changes as they are; the answer opened — its artifacts first, as artifact
        updates, then the status. Anything else sealed in an event is not shown."""
        if event.kind == "task":
            view = cls._opened(TaskView.of(event.raw["task"]), sealed)
            task.update(id=view.id, context=view.context_id or "")
            return [TaskEvent.of({"task": view.raw}, encode({"task": view.raw}))]
        if event.kind != "statusUpdate" or event.state not in (COMPLETED, INPUT_REQUIRED):
            return [event]
        update = dict(event.raw["statusUpdate"])
        status = dict(update["status"])
        tid = str(update.get("taskId") or task.get("id") or "")
        context = str(update.get("contextId") or task.get("context") or "")
        status["message"], artifacts = cls._open_answer(status.get("message"), sealed, tid, context)
        out = []
        for artifact in artifacts:
            data = {"artifactUpdate": {"taskId": tid, "contextId": context, "artifact": artifact}}
            out.append(TaskEvent.of(data, encode(data)))
        update["status"] = status
        update["metadata"] = {**dict(update.get("metadata") or {}),
                              SEALED_URI: {**sealed.shown(), "opened": True}}  # fmt: skip
        data = {"statusUpdate": update}
        return [*out, TaskEvent.of(data, encode(data))]

    def _keyring(self) -> KeyRing:
        if self.keys is None:
            self.keys = KeyRing(credentials.config_dir())
        return self.keys

    @staticmethod
    def _answered_sealed(view: TaskView) -> bool:
        """Whether ``view`` holds an answer to a sealed request (completed, or asking
        back): what :meth:`_read_back` opens. Other states carry no sealed content."""
        return view.state in (COMPLETED, INPUT_REQUIRED) and sealed_request_of(view.raw) is not None

    def _read_back(self, view: TaskView, agent: str, caller: str) -> TaskView:
        """A sealed task read later (not followed from its send), opened: its own request,
        proved this agent's by its signature, says how (:func:`read_back`)."""
        request = sealed_request_of(view.raw)
        assert request is not None
        try:
            sealed = read_back(request, caller=caller, receiver=agent, keys=self._keyring())
        except (SealRefused, KeyProblem) as exc:
            raise RelayError(
                f"task {view.id} is sealed and cannot be opened here: {exc}", code=SEALED,
                said=False,
            ) from None  # fmt: skip
        return self._opened(view, sealed)

    @staticmethod
    def _sent(answer: Any, text: str) -> TaskView:
        if not isinstance(answer, dict) or "task" not in answer:
            raise _bad("SendMessage answered without a task")
        return TaskView.of(answer["task"], text)

    def _decoder(self) -> SSEDecoder:
        return SSEDecoder(max_line=self.max_answer, max_event=self.max_answer)

    @staticmethod
    def _list_params(
        context: str | None, state: str | None, page_size: int | None, page_token: str | None
    ) -> dict[str, Any]:
        given = {"contextId": context, "status": state, "pageSize": page_size,
                 "pageToken": page_token}  # fmt: skip
        return {k: v for k, v in given.items() if v is not None}


class RelayClient(_Calls):
    """A synchronous relay client for one agent credential; close it (or use ``with``).

    ``RelayClient(relay, token)`` with the values, or :meth:`from_credentials` by the
    rule every mellan command follows (``--as``, ``$MELLAN_TOKEN``, the one stored)."""

    http: httpx.Client

    def _connect(self, options: dict[str, Any]) -> httpx.Client:
        return httpx.Client(**options)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------

    def _read(self, r: httpx.Response, deadline: float) -> bytes:
        got = self._limit(r)
        for chunk in r.iter_bytes():
            self._more(got, chunk)
            if time.monotonic() > deadline:
                raise RelayError(
                    f"the relay's answer did not arrive within {self.timeout:g} s",
                    code=UNREACHABLE, said=False,
                )  # fmt: skip
        return bytes(got)

    def _call(
        self, method: str, url: str, body: Any = None, params: Mapping[str, Any] | None = None
    ) -> tuple[Any, str]:
        """One request: the decoded answer and its exact text, or RelayError."""
        content, headers = self._request(body)
        deadline = time.monotonic() + 2 * self.timeout
        try:
            with self.http.stream(
                method, url, content=content, headers=headers, params=params
            ) as r:
                data = self._read(r, deadline)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        return self._answer(r, data, f"{method} {url}")

    def _events(self, url: str, body: Any) -> Iterator[TaskEvent]:
        try:
            with self.http.stream("POST", url, **self._stream_request(body)) as r:
                if not r.is_success:
                    data = self._read(r, time.monotonic() + 2 * self.timeout)
                    self._answer(r, data, f"POST {url}")
                decoder = self._decoder()
                try:
                    for chunk in r.iter_raw():
                        yield from map(_event, decoder.feed(chunk))
                    yield from map(_event, decoder.close())
                except SSEError as exc:
                    raise _bad(f"the event stream is malformed: {exc}") from None
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    # -- what a caller does ---------------------------------------------------------------

    def whoami(self) -> Identity:
        """Whom this credential acts as (read once, then remembered)."""
        if self._identity is None:
            data, _ = self._call("GET", self.relay + "/api/whoami")
            self._identity = Identity.of(data)
        return self._identity

    def workspace(self) -> str:
        """The caller's workspace: the credential's, else whoami's."""
        if self._workspace is None:
            self._workspace = self.whoami().workspace
        return self._workspace

    def base(self, agent: str) -> str:
        """The A2A base URL of ``agent`` in the caller's workspace."""
        return self._base(self.workspace(), agent)

    def call(self, method: str, path: str) -> Any:
        """Another read of the relay as this agent (``/api/...`` or an A2A path), decoded;
        for what the views do not cover (the grant list, an agent card)."""
        url = path if "://" in path else self.relay + path
        data, _ = self._call(method, url)
        return data

    def send(
        self,
        agent: str,
        text: str,
        *,
        capability: str | None = None,
        task: str | None = None,
        context: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        wait: bool = False,
        on_event: OnEvent | None = None,
        seal: bool = False,
    ) -> TaskView:
        """Send a task: accepted at once (the agent may be offline; it waits queued), or
        with ``wait`` followed to its end (``on_event`` sees each event on the way).

        ``seal``: the message's parts are sealed to ``agent``'s key (fetched from the relay
        and checked against this machine's pin: first use pins, a changed key refuses the
        send naming both fingerprints), bound to the routing fields; ``wait`` then opens
        the result, which the receiver sealed to this agent's key."""
        body = self.message_body(
            text, capability=capability, task=task, context=context, metadata=metadata
        )
        body["configuration"] = {"returnImmediately": True}
        sealed = self._sealing(body, agent) if seal else None
        answer, raw = self._call("POST", self.base(agent) + "/message:send", body)
        accepted = self._sent(answer, raw)
        if sealed is not None:
            accepted = self._marked(accepted, sealed, whole=True)
        return self.wait(agent, accepted, on_event=on_event) if wait else accepted

    def wait(
        self, agent: str, task: TaskView | str, *, on_event: OnEvent | None = None
    ) -> TaskView:
        """Follow a task until it completes, fails, is cancelled or asks back
        (``SubscribeToTask``), then read it whole (``GetTask``)."""
        view = task if isinstance(task, TaskView) else self.get(agent, task)
        if not view.done:
            try:
                for event in self.subscribe(agent, view.id):
                    if on_event is not None:
                        on_event(event)
                    if event.state in ENDS:
                        break
            except RelayError:  # it ended before the subscription began?
                if not self._fetch(agent, view.id).done:
                    raise
        return self.get(agent, view.id, seal=view.seal)

    def stream(
        self,
        agent: str,
        text: str,
        *,
        capability: str | None = None,
        task: str | None = None,
        context: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        seal: bool = False,
    ) -> Iterator[TaskEvent]:
        """Send a task and yield its events as they happen (``SendStreamingMessage``): the
        task first, then status and artifact updates, the last one terminal. ``seal``: as
        for :meth:`send`; the states come as they happen and the answer opened at the end
        (a sealed turn sends no progress)."""
        body = self.message_body(
            text, capability=capability, task=task, context=context, metadata=metadata
        )
        if not seal:
            return self._events(self.base(agent) + "/message:stream", body)
        sealed = self._sealing(body, agent)  # refused here, before anything is sent
        return self._sealed_stream(self.base(agent) + "/message:stream", body, sealed)

    def _sealing(self, body: dict[str, Any], agent: str) -> SealedSend:
        """``body``'s message sealed in place to ``agent``'s key, read from the relay (once
        per client) and checked against the pin."""
        url = self._key_url(agent)
        offered = self._call("GET", url)[0] if url else None
        return self._seal(
            body, workspace=self.workspace(), caller=self.whoami().subject, agent=agent,
            offered=offered,
        )  # fmt: skip

    def _sealed_stream(self, url: str, body: Any, sealed: SealedSend) -> Iterator[TaskEvent]:
        seen: dict[str, str] = {}
        for event in self._events(url, body):
            yield from self._sealed_events(event, sealed, seen)

    def subscribe(self, agent: str, task_id: str) -> Iterator[TaskEvent]:
        """Yield an existing task's events from now on (``SubscribeToTask``)."""
        return self._events(self.base(agent) + self._task_path(task_id, "subscribe"), {})

    def get(self, agent: str, task_id: str, *, seal: SealedSend | None = None) -> TaskView:
        """``GetTask``: the task now, with its answer and artifacts. A sealed task's answer
        is opened (``seal``: what its send kept; else read back from the task's own sealed
        request, with this machine's keys and pins), or refused when it does not open."""
        view = self._fetch(agent, task_id)
        if seal is not None:
            return self._opened(view, seal)
        if not self._answered_sealed(view):
            return view
        return self._read_back(view, agent, self.whoami().subject)

    def _fetch(self, agent: str, task_id: str) -> TaskView:
        data, text = self._call("GET", self.base(agent) + self._task_path(task_id))
        return TaskView.of(data, text)

    def list(
        self,
        agent: str,
        *,
        context: str | None = None,
        state: str | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
    ) -> TaskPage:
        """``ListTasks``: the caller's tasks to ``agent``, newest first, one page."""
        params = self._list_params(context, state, page_size, page_token)
        data, _ = self._call("GET", self.base(agent) + "/tasks", params=params)
        return TaskPage.of(data)

    def cancel(self, agent: str, task_id: str) -> TaskView:
        """``CancelTask``: a queued task is cancelled at once, a running one asked to stop."""
        data, text = self._call("POST", self.base(agent) + self._task_path(task_id, "cancel"))
        return TaskView.of(data, text)


class AsyncRelayClient(_Calls):
    """The asynchronous relay client: :class:`RelayClient`'s methods, awaited (streams
    are async iterators). Close it with ``aclose`` (or ``async with``)."""

    http: httpx.AsyncClient

    def _connect(self, options: dict[str, Any]) -> httpx.AsyncClient:
        return httpx.AsyncClient(**options)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- plumbing -------------------------------------------------------------------------

    async def _read(self, r: httpx.Response) -> bytes:
        got = self._limit(r)
        async for chunk in r.aiter_bytes():
            self._more(got, chunk)
        return bytes(got)

    async def _call(
        self, method: str, url: str, body: Any = None, params: Mapping[str, Any] | None = None
    ) -> tuple[Any, str]:
        content, headers = self._request(body)
        try:
            async with asyncio.timeout(2 * self.timeout):
                async with self.http.stream(
                    method, url, content=content, headers=headers, params=params
                ) as r:
                    data = await self._read(r)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise self._unreachable(exc) from None
        return self._answer(r, data, f"{method} {url}")

    async def _events(self, url: str, body: Any) -> AsyncIterator[TaskEvent]:
        try:
            async with self.http.stream("POST", url, **self._stream_request(body)) as r:
                if not r.is_success:
                    async with asyncio.timeout(2 * self.timeout):
                        data = await self._read(r)
                    self._answer(r, data, f"POST {url}")
                decoder = self._decoder()
                try:
                    async for chunk in r.aiter_raw():
                        for ev in decoder.feed(chunk):
                            yield _event(ev)
                    for ev in decoder.close():
                        yield _event(ev)
                except SSEError as exc:
                    raise _bad(f"the event stream is malformed: {exc}") from None
        except (httpx.HTTPError, TimeoutError) as exc:
            raise self._unreachable(exc) from None

    # -- what a caller does ---------------------------------------------------------------

    async def whoami(self) -> Identity:
        if self._identity is None:
            data, _ = await self._call("GET", self.relay + "/api/whoami")
            self._identity = Identity.of(data)
        return self._identity

    async def workspace(self) -> str:
        if self._workspace is None:
            self._workspace = (await self.whoami()).workspace
        return self._workspace

    async def base(self, agent: str) -> str:
        return self._base(await self.workspace(), agent)

    async def call(self, method: str, path: str) -> Any:
        """Another read of the relay as this agent (``/api/...`` or an A2A path), decoded;
        for what the views do not cover (the grant list, an agent card)."""
        url = path if "://" in path else self.relay + path
        data, _ = await self._call(method, url)
        return data

    async def send(
        self,
        agent: str,
        text: str,
        *,
        capability: str | None = None,
        task: str | None = None,
        context: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        wait: bool = False,
        on_event: AsyncOnEvent | None = None,
        seal: bool = False,
    ) -> TaskView:
        body = self.message_body(
            text, capability=capability, task=task, context=context, metadata=metadata
        )
        body["configuration"] = {"returnImmediately": True}
        sealed = await self._sealing(body, agent) if seal else None
        answer, raw = await self._call("POST", await self.base(agent) + "/message:send", body)
        accepted = self._sent(answer, raw)
        if sealed is not None:
            accepted = self._marked(accepted, sealed, whole=True)
        return await self.wait(agent, accepted, on_event=on_event) if wait else accepted

    async def wait(
        self, agent: str, task: TaskView | str, *, on_event: AsyncOnEvent | None = None
    ) -> TaskView:
        view = task if isinstance(task, TaskView) else await self.get(agent, task)
        if not view.done:
            try:
                async for event in self.subscribe(agent, view.id):
                    if on_event is not None:
                        await on_event(event)
                    if event.state in ENDS:
                        break
            except RelayError:
                if not (await self._fetch(agent, view.id)).done:
                    raise
        return await self.get(agent, view.id, seal=view.seal)

    async def stream(
        self,
        agent: str,
        text: str,
        *,
        capability: str | None = None,
        task: str | None = None,
        context: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        seal: bool = False,
    ) -> AsyncIterator[TaskEvent]:
        body = self.message_body(
            text, capability=capability, task=task, context=context, metadata=metadata
        )
        sealed = await self._sealing(body, agent) if seal else None
        seen: dict[str, str] = {}
        async for event in self._events(await self.base(agent) + "/message:stream", body):
            for told in [event] if sealed is None else self._sealed_events(event, sealed, seen):
                yield told

    async def _sealing(self, body: dict[str, Any], agent: str) -> SealedSend:
        url = self._key_url(agent)
        offered = (await self._call("GET", url))[0] if url else None
        workspace, me = await self.workspace(), (await self.whoami()).subject
        return self._seal(body, workspace=workspace, caller=me, agent=agent, offered=offered)

    async def subscribe(self, agent: str, task_id: str) -> AsyncIterator[TaskEvent]:
        url = await self.base(agent) + self._task_path(task_id, "subscribe")
        async for event in self._events(url, {}):
            yield event

    async def get(self, agent: str, task_id: str, *, seal: SealedSend | None = None) -> TaskView:
        view = await self._fetch(agent, task_id)
        if seal is not None:
            return self._opened(view, seal)
        if not self._answered_sealed(view):
            return view
        return self._read_back(view, agent, (await self.whoami()).subject)

    async def _fetch(self, agent: str, task_id: str) -> TaskView:
        data, text = await self._call("GET", await self.base(agent) + self._task_path(task_id))
        return TaskView.of(data, text)

    async def list(
        self,
        agent: str,
        *,
        context: str | None = None,
        state: str | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
    ) -> TaskPage:
        params = self._list_params(context, state, page_size, page_token)
        data, _ = await self._call("GET", await self.base(agent) + "/tasks", params=params)
        return TaskPage.of(data)

    async def cancel(self, agent: str, task_id: str) -> TaskView:
        url = await self.base(agent) + self._task_path(task_id, "cancel")
        data, text = await self._call("POST", url)
        return TaskView.of(data, text)
