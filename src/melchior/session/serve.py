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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from melchior import names
from melchior.envelope import TELL_SORTS
from melchior.policy.fence import fence_new
from melchior.policy.hops import Chain, check_hop, first_hop
from melchior.policy.walls import Session, Talk, between
from melchior.session.client import peer_uid
from melchior.session.identity import Identity, same_secret
from melchior.session.registry import Registry
from melchior.session.verbs import BY_NAME, VERBS
from melchior.wire import frames, lines
from melchior.wire.codec import JSONObject, WireError
from melchior.wire.envelope import Refused, event, refused
from melchior.wire.server import answer

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
        raise Refused(str(exc), "bad-args") from None


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

    async def send(self, msg: JSONObject) -> str | None:
        """Hand ``msg`` to the harness. Returns None: the pipe cannot tell whether the
        harness's model has read it, so the receipt follows the harness's busy flag. An
        Output that does know (the MCP bridge's inbox) returns the receipt kind instead."""
        if self._writer is None:
            lines.write_sync(sys.stdout.buffer, msg)
        else:
            await lines.write(self._writer, msg)
        return None


class Serve:
    """One session's answers. Handlers read the registry; walls come from policy."""

    def __init__(self, me: Identity, reg: Registry, talk: Talk, out: Output) -> None:
        self.me = me
        self.reg = reg
        self.talk = talk
        self.out = out
        self.state = State()
        self.published: Published | None = None
        self.done = asyncio.Event()
        self.ended_by: str | None = None
        self._last_problem: str | None = None

    # -- publishing ----------------------------------------------------------------------

    async def publish(self) -> Path:
        if self.me.parent is not None:
            # Before listening: a child must never be seen without its parent note,
            # or for a moment it would look like a front door.
            self.reg.write_notes(self.me.id, self.me.parent, self.me.role)
        sock, inode = publish_socket(self.reg, self.me.id)
        server = await asyncio.start_unix_server(self.connection, sock=sock)
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

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is None or peer_uid(sock) != os.getuid():
            msg = refused("sessions answer only their own user", code="other-uid")
            with contextlib.suppress(Exception):
                await frames.write(writer, msg)
            writer.close()
            return
        try:
            await answer(reader, writer, self.on_call)
        except asyncio.CancelledError:
            # Serve is shutting down with this connection open. Ending the handler quietly
            # is the whole of the work left; Python 3.11's stream callback would otherwise
            # print the cancellation as an error on the harness's stderr.
            return

    def _caller(self, msg: JSONObject) -> Session | None:
        sender = msg.get("from")
        if sender is None:
            return None
        if not isinstance(sender, str) or not names.is_id(sender):
            raise Refused(f"'from' must be a session id, got {sender!r}", "bad-from")
        if sender == self.me.id:
            return self.me.session()
        if not self.reg.is_listed(sender):
            raise Refused(
                f"the caller says it is {sender}, but no session {sender} is listening in "
                f"project {self.me.project!r}",
                "unknown-sender",
            )
        return self.reg.session(sender)

    def _address(self, caller: Session | None) -> str:
        if caller is None:
            return str(names.Address(self.me.project, names.OPERATOR_ROLE, names.ANONYMOUS))
        return str(names.Address(caller.project, caller.role, caller.id))

    async def on_call(self, verb: str, args: list[Any], msg: JSONObject) -> list[Any]:
        spec = BY_NAME.get(verb)
        if spec is None:
            raise Refused(
                f"unknown verb {verb!r}; this session answers {', '.join(BY_NAME)}",
                "unknown-verb",
            )
        caller = self._caller(msg)
        if caller is None and not spec.anonymous:
            raise Refused(
                f"'{verb}' needs to know who is calling: put your session id in 'from'",
                "anonymous",
            )
        if caller is not None:
            me = self.me.session()
            decision = between(caller, me, self.reg.ancestry_tree(caller, me), self.talk)
            if not decision.allowed:
                raise Refused(
                    decision.reason, "refused", {"rule": decision.rule, "receipt": "refused"}
                )
        handler = getattr(self, f"verb_{verb}")
        try:
            result: list[Any] = await handler(args, msg, caller)
        except (Refused, WireError):
            raise
        except Exception as exc:
            # A bug must still be a reply: a dropped connection would look like "dead".
            print(f"melchior serve: {verb} failed: {exc!r}", file=sys.stderr)
            raise Refused(
                f"{self.me.id} failed while answering {verb!r}: {exc}", "internal"
            ) from None
        return result

    # -- verbs ------------------------------------------------------------------------------

    async def verb_status(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
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

    async def verb_verbs(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 0, 0, "verbs takes no arguments")
        return [v.as_dict() for v in VERBS]

    def _chain(self, msg: JSONObject, caller: Session | None) -> Chain:
        raw = msg.get("chain")
        if raw is None:
            return first_hop(caller.id if caller is not None else names.ANONYMOUS)
        if not isinstance(raw, dict):
            raise Refused("'chain' must be an object {chain, hop, path}", "bad-chain")
        try:
            chain = Chain.from_dict(raw)
        except ValueError as exc:
            raise Refused(f"bad 'chain': {exc}", "bad-chain") from None
        decision = check_hop(chain)
        if not decision.allowed:
            raise Refused(decision.reason, "refused", {"rule": decision.rule, "receipt": "refused"})
        return chain

    async def _deliver(self, caller: Session | None, sort: str, text: str, **extra: Any) -> str:
        """Hand one message to the harness; the receipt says truthfully where it now is."""
        who = self._address(caller)
        fenced = fence_new(text, who, sort)
        fields: JSONObject = {"who": who, "sort": sort, "text": text}
        fields["from"] = caller.id if caller is not None else None
        fields.update(extra)
        fields["fenced"] = fenced.text
        try:
            kind = await self.out.send(event("message", **fields))
        except (ConnectionError, OSError) as exc:
            raise Refused(
                f"{self.me.id}'s harness is gone ({exc}); the message was not delivered",
                "harness-gone",
                {"receipt": "refused"},
            ) from None
        if kind is not None:
            return kind
        # Busy: the harness holds it until the current work is done.
        return "queued" if self.state.busy else "delivered"

    async def verb_tell(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 1, 2, "tell takes [text, sort?]")
        text = _text(args[0])
        sort = args[1] if len(args) > 1 and args[1] is not None else "attention"
        if sort not in TELL_SORTS:
            raise Refused(
                f"sort {sort!r} is not one of {', '.join(TELL_SORTS)}; questions go through "
                "'ask' and reports through 'report'",
                "bad-args",
            )
        chain = self._chain(msg, caller)
        mid = new_message_id()
        receipt = await self._deliver(caller, sort, text, message_id=mid, **chain.as_dict())
        return [{"receipt": receipt, "message_id": mid}]

    async def verb_ask(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 1, 1, "ask takes [text]")
        assert caller is not None
        text = _text(args[0])
        chain = self._chain(msg, caller)
        mid = new_message_id()
        about = f"{self.me.id}@{mid}"
        self.state.questions[about] = (caller.id, chain)
        receipt = await self._deliver(
            caller, "question", text, message_id=mid, about=about, **chain.as_dict()
        )
        return [{"receipt": receipt, "about": about, "message_id": mid}]

    async def verb_answer(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 2, 2, "answer takes [about, text]")
        assert caller is not None
        about = args[0]
        callee, _mid = split_about(about)
        text = _text(args[1])
        if callee != caller.id:
            raise Refused(
                f"only {callee} can answer {about}; you are {caller.id}",
                "refused",
                {"rule": "callee-answers", "receipt": "refused"},
            )
        if about in self.state.answers:
            raise Refused(
                f"{about} is already answered",
                "refused",
                {"rule": "answered-once", "receipt": "refused"},
            )
        extra = self._chain(msg, caller).as_dict() if "chain" in msg else {}
        self.state.answers[about] = {"who": self._address(caller), "text": text}
        await self._deliver(caller, "answer", text, about=about, **extra)
        return [{"receipt": "delivered"}]

    async def verb_task(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
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
        raise Refused(f"{self.me.id} knows of no question {about} asked by you", "unknown-task")

    async def verb_report(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 2, 2, "report takes [revision, sha256]")
        assert caller is not None
        revision, digest = args
        if not isinstance(revision, int) or isinstance(revision, bool) or revision < 1:
            raise Refused("revision must be a whole number of at least 1", "bad-args")
        if not isinstance(digest, str) or len(digest) != 64:
            raise Refused("sha256 must be 64 hex digits", "bad-args")
        if caller.parent != self.me.id:
            raise Refused(
                f"{caller.id} is not a child of {self.me.id}; only children report to a parent",
                "refused",
                {"rule": "children-report", "receipt": "refused"},
            )
        text = (
            f"{caller.id} stored report revision {revision}; read it with "
            f"'melchior tool --verb=report --who={caller.id}'"
        )
        await self._deliver(caller, "report", text, revision=revision, sha256=digest)
        return [{"receipt": "delivered"}]

    async def verb_end(self, args: list[Any], msg: JSONObject, caller: Session | None) -> Any:
        _arity(args, 1, 1, "end takes [token]")
        token = args[0]
        if self.me.token is None:
            raise Refused(
                f"{self.me.id} was not started by 'melchior fork'; only its harness can end it",
                "refused",
                {"rule": "token", "receipt": "refused"},
            )
        if not isinstance(token, str) or not same_secret(token, self.me.token):
            raise Refused(
                f"that is not {self.me.id}'s token; only the session that minted it can end it",
                "refused",
                {"rule": "token", "receipt": "refused"},
            )
        self.ended_by = self._address(caller)
        asyncio.get_running_loop().call_soon(self.done.set)
        return [{"ending": True}]


def _arity(args: list[Any], low: int, high: int, usage: str) -> None:
    if not low <= len(args) <= high:
        raise Refused(f"{usage}; got {len(args)} argument(s)", "bad-args")


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Refused("the message text must be a non-empty string", "bad-args")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise Refused(
            f"the message text holds a lone surrogate at character {exc.start}; it is not "
            "Unicode text",
            "bad-args",
        ) from None
    if size > MAX_TEXT:
        raise Refused(
            f"the message is {size} bytes, over the {MAX_TEXT}-byte limit; "
            "put long text in a report instead",
            "too-large",
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
        tasks = [asyncio.create_task(serve.read_parent(reader)), asyncio.create_task(serve.watch())]
        await serve.done.wait()
        for task in tasks:
            task.cancel()
        if serve.ended_by is not None:
            with contextlib.suppress(Exception):
                await out.send(event("end", who=serve.ended_by, id=me.id))
    finally:
        serve.unpublish()
    return 0
