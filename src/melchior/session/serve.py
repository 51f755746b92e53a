"""``melchior serve``: one session's socket, alive exactly as long as its harness.

serve is a child, not a daemon. It reads its parent's pipe and exits when the pipe
closes, so the name in the registry never outlives the harness it stands for: a
layer that did would answer for a session that can no longer act, and a sibling
would be told its message landed.

Pipe in (stdin, NDJSON): ``{"event":"doing","busy":…,"working_for":…,"waiting":…}``.
Pipe out (stdout, NDJSON): ``{"event":"listening","at":…}``, then one
``{"event":"message",…}`` per message handed to the harness, and ``{"event":"end",…}``
if the session's minter ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from melchior import names
from melchior.envelope import (
    DELIVERED,
    QUEUED,
    TELL_SORTS,
    AsyncDelivery,
    Message,
    Receipt,
    check,
    deny,
    receipt,
    refusal,
    refused_receipt,
)
from melchior.policy.decision import refuse
from melchior.policy.hops import Chain, check_hop, first_hop
from melchior.policy.local import answered_once, callee_answers, children_report, token_ends
from melchior.policy.walls import Session, Talk, between
from melchior.session.client import peer_uid
from melchior.session.identity import Identity, same_secret
from melchior.session.registry import Registry
from melchior.session.verbs import BY_NAME, VERBS
from melchior.wire import lines
from melchior.wire import server as wire_server
from melchior.wire.calls import Refused, event, refused
from melchior.wire.codec import JSONObject, WireError

CHECK_INTERVAL = 2.0
"""Seconds between checks that our socket is still published (and re-publishing)."""

MAX_TEXT = 1024 * 1024
"""Largest message text accepted, in UTF-8 bytes."""


def new_message_id() -> str:
    return "m" + secrets.token_hex(6)


def split_about(about: Any) -> tuple[str, str]:
    """``<callee-id>@<message-id>`` → (callee, message id), or a refusal saying why."""
    try:
        return names.split_handle(about)
    except names.NamingError as exc:
        raise deny("bad-args", str(exc)) from None


@dataclass
class Published:
    """A socket we published: kept to unlink it only while the inode is still ours."""

    path: Path
    inode: tuple[int, int]
    server: asyncio.AbstractServer


@dataclass
class State:
    busy: bool = False
    working_for: Any = None
    waiting: Any = 0
    questions: dict[str, tuple[str, Chain]] = field(default_factory=dict)
    """Questions asked of us: about → (asker id, the question's chain)."""
    answers: dict[str, JSONObject] = field(default_factory=dict)
    """Answers to our questions: about → {"who","text"}."""


def publish_socket(reg: Registry, sid: str) -> tuple[socket.socket, tuple[int, int]]:
    """Bind a temporary name, listen, then rename into place.

    A socket between bind() and listen() refuses connections exactly like a dead one;
    publishing only after listen() means anything under the final name that refuses
    is truly dead. The umask keeps the inode 0600 from birth.
    """
    final = reg.path(sid)
    tmp = reg.dir / f".{sid}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            s.bind(os.fspath(tmp))
        finally:
            os.umask(old)
        s.listen(128)
        os.rename(tmp, final)
        # Sticky: exempt from the XDG runtime dir's six-hour cleanup.
        with contextlib.suppress(OSError):
            os.chmod(final, 0o600 | stat.S_ISVTX)
        st = os.lstat(final)
    except BaseException:
        s.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    s.setblocking(False)
    return s, (st.st_ino, st.st_dev)


def unpublish(path: Path, inode: tuple[int, int]) -> bool:
    """Remove our socket entry, but never a replacement someone else put there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if (st.st_ino, st.st_dev) != inode:
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return True


class Output:
    """The pipe to the harness. Writes wait for the harness to read (back-pressure)."""

    def __init__(self, writer: asyncio.StreamWriter | None) -> None:
        self._writer = writer

    @classmethod
    async def open(cls) -> Output:
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, sys.stdout
            )
        except (ValueError, OSError):
            return cls(None)  # a regular file: plain blocking writes are fine
        return cls(asyncio.StreamWriter(transport, protocol, None, loop))

    async def send(self, msg: JSONObject) -> None:
        if self._writer is None:
            lines.write_sync(sys.stdout.buffer, msg)
        else:
            await lines.write(self._writer, msg)


class Serve:
    """One session's answers. Handlers read the registry; walls come from policy."""

    def __init__(self, me: Identity, reg: Registry, talk: Talk, out: Output) -> None:
        self.me = me
        self.reg = reg
        self.talk = talk
        self.out = out
        self.state = State()
        # Any AsyncDelivery may stand in (the MCP bridge's inbox): serve only hands it messages.
        self.harness: AsyncDelivery = Harness(out, self.state, me.id)
        self.published: Published | None = None
        self.done = asyncio.Event()
        self.ended_by: str | None = None
        self._last_problem: str | None = None
        self._now: dict[str, Callable[..., Any] | None] = {}
        """verb → its handler when that never waits (answered at once), else None."""

    # -- publishing ----------------------------------------------------------------------

    async def publish(self) -> Path:
        if self.me.parent is not None:
            # Before listening: a child must never be seen without its parent note,
            # or for a moment it would look like a front door.
            self.reg.write_notes(self.me.id, self.me.parent, self.me.role)
        sock, inode = publish_socket(self.reg, self.me.id)
        server = await asyncio.get_running_loop().create_unix_server(self.protocol, sock=sock)
        old, self.published = self.published, Published(self.reg.path(self.me.id), inode, server)
        if old is not None:
            old.server.close()
        return self.published.path

    async def check_published(self) -> None:
        """Re-create the directory and re-publish if our socket vanished from under us."""
        if self.published is None or self.done.is_set():
            return
        try:
            st = os.lstat(self.published.path)
            if (st.st_ino, st.st_dev) == self.published.inode:
                return
        except FileNotFoundError:
            pass
        try:
            self.reg = Registry.open(self.me.project)
            names.record_id(self.reg.dir, self.me.id)
            path = await self.publish()
        except (OSError, names.NamingError) as exc:
            problem = f"melchior serve: cannot re-publish {self.me.id}: {exc}"
            if problem != self._last_problem:  # said once, retried quietly
                print(problem, file=sys.stderr)
                self._last_problem = problem
            return
        self._last_problem = None
        await self.out.send(event("listening", at=str(path), id=self.me.id, recovered=True))

    async def watch(self) -> None:
        while not self.done.is_set():
            await asyncio.sleep(CHECK_INTERVAL)
            await self.check_published()

    def unpublish(self) -> None:
        if self.published is not None:
            self.published.server.close()
            unpublish(self.published.path, self.published.inode)

    # -- the parent's pipe ------------------------------------------------------------------

    async def read_parent(self, reader: asyncio.StreamReader) -> None:
        async for item in lines.aiter_messages(reader):
            if isinstance(item, WireError):
                print(f"melchior serve: ignored a line from the harness: {item}", file=sys.stderr)
                continue
            if item.get("event") == "doing":
                self.state.busy = bool(item.get("busy", False))
                self.state.working_for = item.get("working_for")
                self.state.waiting = item.get("waiting", 0)
                await self.check_published()
            else:
                print(
                    f"melchior serve: ignored {str(item)[:80]}; the harness sends only "
                    '{"event":"doing",…}',
                    file=sys.stderr,
                )
        self.done.set()

    # -- the socket -------------------------------------------------------------------------

    def protocol(self) -> wire_server.Answerer:
        """One connection: the socket rules (melchior.wire.server), our peer check, our verbs."""
        return wire_server.Answerer(self.on_call, now=self.answer_now, peer=self.check_peer)

    def check_peer(self, sock: Any) -> JSONObject | None:
        """Another user's process gets one refusal and is disconnected (SO_PEERCRED)."""
        if sock is None or peer_uid(sock) != os.getuid():
            return other_uid_refusal()
        return None

    def _caller(self, msg: JSONObject) -> Session | None:
        sender = msg.get("from")
        if sender is None:
            return None
        if not isinstance(sender, str) or not names.is_id(sender):
            raise deny("bad-from", f"'from' must be a session id, got {sender!r}")
        if sender == self.me.id:
            return self.me.session()
        if not self.reg.is_listed(sender):
            raise deny(
                "unknown-sender",
                f"the caller says it is {sender}, but no session {sender} is listening in "
                f"project {self.me.project!r}",
            )
        return self.reg.session(sender)

    def _address(self, caller: Session | None) -> str:
        if caller is None:
            return str(names.Address(self.me.project, names.OPERATOR_ROLE, names.ANONYMOUS))
        return str(names.Address(caller.project, caller.role, caller.id))

    def _admit(self, verb: str, msg: JSONObject) -> Session | None:
        """The caller of ``verb``, once the verb exists, the caller may be anonymous or is
        listed, and the walls let it reach us; a refusal naming the rule otherwise."""
        spec = BY_NAME.get(verb)
        if spec is None:
            raise deny(
                "unknown-verb", f"unknown verb {verb!r}; this session answers {', '.join(BY_NAME)}"
            )
        caller = self._caller(msg)
        if caller is None and not spec.anonymous:
            raise deny(
                "anonymous", f"'{verb}' needs to know who is calling: put your session id in 'from'"
            )
        if caller is not None:
            me = self.me.session()
            check(between(caller, me, self.reg.ancestry_tree(caller, me), self.talk))
        return caller

    def _internal(self, verb: str, exc: Exception) -> Refused:
        # A bug must still be a reply: a dropped connection would look like "dead".
        print(f"melchior serve: {verb} failed: {exc!r}", file=sys.stderr)
        return deny("internal", f"{self.me.id} failed while answering {verb!r}: {exc}")

    def answer_now(self, verb: str, args: list[Any], msg: JSONObject) -> list[Any] | None:
        """Answer a verb whose handler never waits (``status``, ``verbs``, ``task``) inside
        the socket's read callback; None for every other verb, decided before any check,
        and :meth:`on_call` answers it in a task. Same checks, same refusals."""
        try:
            handler = self._now[verb]
        except KeyError:
            found = getattr(self, f"verb_{verb}", None) if verb in BY_NAME else None
            handler = None if found is None or asyncio.iscoroutinefunction(found) else found
            if verb in BY_NAME:  # the table is fixed: a cache keyed by it stays small
                self._now[verb] = handler
        if handler is None:
            return None
        caller = self._admit(verb, msg)
        try:
            result: list[Any] = handler(args, msg, caller)
        except (Refused, WireError):
            raise
        except Exception as exc:
            raise self._internal(verb, exc) from None
        return result

    async def on_call(self, verb: str, args: list[Any], msg: JSONObject) -> list[Any]:
        caller = self._admit(verb, msg)
        handler = getattr(self, f"verb_{verb}")
        try:
            result: list[Any] = handler(args, msg, caller)
            if asyncio.iscoroutine(result):
                result = await result
        except (Refused, WireError):
            raise
        except Exception as exc:
            raise self._internal(verb, exc) from None
        return result

    # -- verbs ------------------------------------------------------------------------------

    def verb_status(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 0, 0, "status takes no arguments")
        return [
            {
                "id": self.me.id,
                "project": self.me.project,
                "role": self.me.role,
                "parent": self.me.parent,
                "busy": self.state.busy,
                "working_for": self.state.working_for,
                "waiting": self.state.waiting,
            }
        ]

    def verb_verbs(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 0, 0, "verbs takes no arguments")
        return [v.as_dict() for v in VERBS]

    def _chain(self, msg: JSONObject, caller: Session | None) -> Chain:
        raw = msg.get("chain")
        if raw is None:
            return first_hop(caller.id if caller is not None else names.ANONYMOUS)
        if not isinstance(raw, dict):
            raise deny("bad-chain", "'chain' must be an object {chain, hop, path}")
        try:
            chain = Chain.from_dict(raw)
        except ValueError as exc:
            raise deny("bad-chain", f"bad 'chain': {exc}") from None
        check(check_hop(chain))
        return chain

    async def _deliver(self, message: Message) -> Receipt:
        """Hand one message to the harness; a gone harness is a refusal, never a receipt."""
        got = await self.harness.deliver(message)
        if got.decision is not None:
            raise refusal(got.decision, code=got.decision.rule)
        return got

    def _message(
        self,
        caller: Session | None,
        sort: str,
        text: str,
        *,
        chain: Chain | None = None,
        message_id: str | None = None,
        about: str | None = None,
        **metadata: Any,
    ) -> Message:
        return Message(
            sender=self._address(caller),
            recipient=self.me.id,
            text=text,
            sort=sort,
            chain=chain,
            message_id=message_id,
            about=about,
            metadata={"from": caller.id if caller is not None else None, **metadata},
        )

    async def verb_tell(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 1, 2, "tell takes [text, sort?]")
        text = _text(args[0])
        sort = args[1] if len(args) > 1 and args[1] is not None else "attention"
        if sort not in TELL_SORTS:
            raise deny(
                "bad-args",
                f"sort {sort!r} is not one of {', '.join(TELL_SORTS)}; questions go through "
                "'ask' and reports through 'report'",
            )
        chain = self._chain(msg, caller)
        message = self._message(caller, sort, text, chain=chain, message_id=new_message_id())
        return [(await self._deliver(message)).as_dict()]

    async def verb_ask(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 1, 1, "ask takes [text]")
        assert caller is not None
        text = _text(args[0])
        chain = self._chain(msg, caller)
        mid = new_message_id()
        about = f"{self.me.id}@{mid}"
        self.state.questions[about] = (caller.id, chain)
        message = self._message(caller, "question", text, chain=chain, message_id=mid, about=about)
        got = await self._deliver(message)
        return [{**got.as_dict(), "about": about}]

    async def verb_answer(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 2, 2, "answer takes [about, text]")
        assert caller is not None
        about = args[0]
        callee, _mid = split_about(about)
        text = _text(args[1])
        check(callee_answers(about, callee, caller.id))
        check(answered_once(about, about in self.state.answers))
        chain = self._chain(msg, caller) if "chain" in msg else None
        self.state.answers[about] = {"who": self._address(caller), "text": text}
        await self._deliver(self._message(caller, "answer", text, chain=chain, about=about))
        return [receipt(DELIVERED).as_dict()]

    def verb_task(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 1, 1, "task takes [about]")
        assert caller is not None
        about = args[0]
        split_about(about)
        if about in self.state.answers and caller.id == self.me.id:
            got = self.state.answers[about]
            return [{"about": about, "state": "answered", "who": got["who"], "answer": got["text"]}]
        asked = self.state.questions.get(about)
        if asked is not None and caller.id in (asked[0], self.me.id):
            asker, chain = asked
            return [{"about": about, "state": "pending", "asker": asker, "chain": chain.as_dict()}]
        raise deny("unknown-task", f"{self.me.id} knows of no question {about} asked by you")

    async def verb_report(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 2, 2, "report takes [revision, sha256]")
        assert caller is not None
        revision, digest = args
        if not isinstance(revision, int) or isinstance(revision, bool) or revision < 1:
            raise deny("bad-args", "revision must be a whole number of at least 1")
        if not isinstance(digest, str) or len(digest) != 64:
            raise deny("bad-args", "sha256 must be 64 hex digits")
        check(children_report(caller.id, caller.parent, self.me.id))
        text = (
            f"{caller.id} stored report revision {revision}; read it with "
            f"'melchior tool --verb=report --who={caller.id}'"
        )
        note = self._message(caller, "report", text, revision=revision, sha256=digest)
        await self._deliver(note)
        return [receipt(DELIVERED).as_dict()]

    async def verb_end(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 1, 1, "end takes [token]")
        token = args[0]
        mine = self.me.token
        matches = mine is not None and isinstance(token, str) and same_secret(token, mine)
        check(token_ends(self.me.id, mine is not None, matches))
        self.ended_by = self._address(caller)
        asyncio.get_running_loop().call_soon(self.done.set)
        return [{"ending": True}]


def other_uid_refusal() -> JSONObject:
    """The one reply a process of another user gets before it is disconnected: the kernel's
    peer credentials decided it, and like every refusal it names its rule."""
    exc = deny("other-uid", "sessions answer only their own user")
    return refused(exc.reason, code=exc.code, **exc.detail)


class Harness:
    """The pipe to this session's harness, as an :class:`~melchior.envelope.AsyncDelivery`.

    A message handed to it is ``delivered`` — or ``queued`` when the harness last said it
    is busy: it has the message either way, and will read it after the current work.
    Peer text is fenced here, by the envelope, for every sort; a harness that is gone
    is a refusal (``harness-gone``), never a receipt that something landed."""

    def __init__(self, out: Output, state: State, me: str) -> None:
        self.out = out
        self.state = state
        self.me = me

    async def deliver(self, message: Message) -> Receipt:
        meta = dict(message.metadata or {})
        fields: JSONObject = {
            "who": message.sender,
            "sort": message.sort,
            "text": message.text,
            "from": meta.pop("from", None),
        }
        if message.message_id is not None:
            fields["message_id"] = message.message_id
        if message.about is not None:
            fields["about"] = message.about
        if message.chain is not None:
            fields.update(message.chain.as_dict())
        fields.update(meta)
        fields["fenced"] = message.fenced().text
        try:
            await self.out.send(event("message", **fields))
        except (ConnectionError, OSError) as exc:
            gone = refuse(
                "harness-gone",
                f"{self.me}'s harness is gone ({exc}); the message was not delivered",
            )
            return refused_receipt(gone, message.message_id)
        return receipt(QUEUED if self.state.busy else DELIVERED, message.message_id)


def _arity(args: list[Any], low: int, high: int, usage: str) -> None:
    if not low <= len(args) <= high:
        raise deny("bad-args", f"{usage}; got {len(args)} argument(s)")


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise deny("bad-args", "the message text must be a non-empty string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise deny(
            "bad-args",
            f"the message text holds a lone surrogate at character {exc.start}; it is not "
            "Unicode text",
        ) from None
    if size > MAX_TEXT:
        raise deny(
            "too-large",
            f"the message is {size} bytes, over the {MAX_TEXT}-byte limit; "
            "put long text in a report instead",
        )
    return value


async def run(me: Identity, reg: Registry, talk: Talk) -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except ValueError:
        print(
            "melchior serve: stdin must be the harness's pipe (serve exits when it closes); "
            "got a regular file",
            file=sys.stderr,
        )
        return 2
    out = await Output.open()
    serve = Serve(me, reg, talk, out)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, serve.done.set)
    path = await serve.publish()
    try:
        await out.send(event("listening", at=str(path), id=me.id, project=me.project))
        # Both loops are owned here and awaited on the way out: nothing outlives serve.
        async with asyncio.TaskGroup() as loops:
            parent = loops.create_task(serve.read_parent(reader), name="serve-parent-pipe")
            watch = loops.create_task(serve.watch(), name="serve-publish-watch")
            await serve.done.wait()
            parent.cancel()
            watch.cancel()
        if serve.ended_by is not None:
            with contextlib.suppress(Exception):
                await out.send(event("end", who=serve.ended_by, id=me.id))
    finally:
        serve.unpublish()
    return 0
