"""The Lua client, run by a real Lua interpreter (lupa) over real unix sockets.

The host side of the contract (``host.stream``) is implemented here with Python's
``socket`` module, exactly as a harness would: the client never sees Python, only a
function that opens a stream and an object with read/write/close. Every Lua that
lupa ships is exercised, because siblings load this file into whatever Lua they have.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import math
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from melchior.commands.lua_api import source
from melchior.wire.calls import Refused
from melchior.wire.codec import JSONObject
from melchior.wire.frames import FrameDecoder
from melchior.wire.gate import FORBIDDEN_TAGS
from melchior.wire.server import Answerer
from paths_kit import TESTS

lupa = pytest.importorskip("lupa")

CLIENT = source()
FIXTURES = TESTS / "fixtures" / "wire"


def _flavours() -> list[str]:
    found = []
    for name in ("lua54", "lua53", "lua55", "lua52", "lua51", "luajit21", "luajit20"):
        with contextlib.suppress(ImportError):
            importlib.import_module(f"lupa.{name}")
            found.append(name)
    return found


FLAVOURS = _flavours()
LuaError = tuple(importlib.import_module(f"lupa.{name}").LuaError for name in FLAVOURS)
"""Each Lua runtime module has its own LuaError class."""
INTEGER_LUAS = {"lua53", "lua54", "lua55"}
"""Luas with a 64-bit integer subtype; the others have doubles only."""


# -- the host: host.stream over Python sockets ----------------------------------------------


class PyStream:
    """A host stream: what a harness hands the client. Records the bytes both ways."""

    def __init__(self, path: bytes, *, chunk: int | None = None, partial: int | None = None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.chunk = chunk
        self.partial = partial
        self.sent = bytearray()
        self.received = bytearray()
        self.closed = False

    def read(self, n: int) -> bytes:
        data = self.sock.recv(min(n, self.chunk) if self.chunk else n)
        self.received += data
        return data

    def write(self, data: bytes) -> int | bool:
        if self.partial and len(data) > self.partial:
            data = data[: self.partial]
            self.sock.sendall(data)
            self.sent += data
            return len(data)
        self.sock.sendall(data)
        self.sent += data
        return True

    def close(self) -> None:
        self.closed = True
        self.sock.close()


class Lua:
    """One Lua interpreter with the client loaded into it."""

    def __init__(
        self,
        flavour: str = "lua54",
        src: bytes = CLIENT,
        settings: dict[str, Any] | None = None,
        **stream_opts: int,
    ) -> None:
        mod = importlib.import_module(f"lupa.{flavour}")
        self.flavour = flavour
        self.rt = mod.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self.streams: list[PyStream] = []
        self._stream_opts = stream_opts
        loader = self.rt.eval(
            "function(src, opener, settings)"
            "  local f, err = (loadstring or load)(src, '=melchior')"
            "  if not f then error(err, 0) end"
            "  return f(opener, settings)"
            "end"
        )
        self.m = loader(src, self.open, self.table(settings) if settings else None)
        self._kind = self.rt.eval(
            "function(m, v)"
            "  if v == m.null then return 'null' end"
            "  local mt = getmetatable(v)"
            "  if mt == getmetatable(m.array()) then return 'array' end"
            "  if mt == getmetatable(m.object()) then return 'object' end"
            "  return type(v)"
            "end"
        )

    @property
    def integers(self) -> bool:
        return self.flavour in INTEGER_LUAS

    def open(self, path: bytes) -> PyStream:
        s = PyStream(path, **self._stream_opts)
        self.streams.append(s)
        return s

    def table(self, values: dict[str, Any]) -> Any:
        t = self.rt.table()
        for k, v in values.items():
            t[k.encode()] = v.encode() if isinstance(v, str) else v
        return t

    def run(self, code: str, *args: Any) -> Any:
        """Run a chunk; ``...`` is (melchior, *args). Python str args arrive as Lua strings."""
        lua_args = [a.encode() if isinstance(a, str) else a for a in args]
        return self.rt.execute(code.encode(), self.m, *lua_args)

    def to_py(self, v: Any) -> Any:
        """Convert a decoded Lua value to Python by its JSON marking, independently of encode."""
        kind = self._kind(self.m, v)
        if kind == b"null":
            return None
        if kind == b"array":
            return [self.to_py(v[i]) for i in range(1, len(v) + 1)]
        if kind == b"object":
            return {k.decode(): self.to_py(x) for k, x in v.items()}
        if isinstance(v, bytes):
            return v.decode()
        return v


def lua_error(exc: BaseException) -> str:
    """The Lua error message without lupa's traceback."""
    text = str(exc.args[0] if exc.args else exc)
    if isinstance(exc.args[0] if exc.args else None, bytes):
        text = exc.args[0].decode()
    return text.split("\nstack traceback:")[0]


# -- a session stand-in built on melchior.wire.server.Answerer -------------------------------


class SessionServer:
    """Answers the socket verbs the way a session does, on a real unix socket.

    Runs its own asyncio loop in a thread so the Lua client (blocking, in the test's
    thread) talks to it over the kernel like any other peer.
    """

    def __init__(self, path: Path, sid: str = "beta-nu") -> None:
        self.path = path
        self.sid = sid
        self.calls: list[JSONObject] = []
        self.events: list[JSONObject] = []
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> asyncio.AbstractServer:
            return await asyncio.get_running_loop().create_unix_server(
                lambda: Answerer(self.on_call, self.on_event), path=str(self.path)
            )

        self._server = self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()
            # connections still open are ended here, not left to a closed loop
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def message_id(self) -> str:
        self._next += 1
        return f"m-{self._next}"

    async def on_event(self, msg: JSONObject) -> None:
        self.events.append(msg)

    async def on_call(self, verb: str, args: list[Any], msg: JSONObject) -> list[Any]:
        self.calls.append(msg)

        def strings(lo: int, hi: int) -> None:
            if not lo <= len(args) <= hi or not all(isinstance(a, str) for a in args):
                raise Refused(f"{verb} takes {lo}..{hi} string arguments", "bad-args")

        if verb == "status":
            strings(0, 0)
            return [
                {
                    "id": self.sid,
                    "project": "demo",
                    "role": "main",
                    "parent": None,
                    "busy": False,
                    "working_for": 0,
                    "waiting": 0,
                }
            ]
        if verb == "tell":
            strings(1, 2)
            return [{"receipt": "delivered", "message_id": self.message_id()}]
        if verb == "ask":
            strings(1, 1)
            return [{"receipt": "delivered", "about": f"{self.sid}@{self.message_id()}"}]
        if verb == "answer":
            strings(2, 2)
            return [{"receipt": "delivered"}]
        if verb == "verbs":
            strings(0, 0)
            return [
                {"name": "status", "args": [], "summary": "how this session stands"},
                {"name": "tell", "args": ["text", "sort?"], "summary": "leave a message"},
                {"name": "ask", "args": ["text"], "summary": "ask a question"},
                {"name": "answer", "args": ["about", "text"], "summary": "answer a question"},
                {"name": "verbs", "args": [], "summary": "this list"},
            ]
        if verb == "echo":  # test-only: hands the arguments back as the results
            return args
        if verb == "refuse":
            raise Refused("the instance wall: beta-nu is private to its main", "walls")
        raise Refused(f"unknown verb {verb!r}", "unknown-verb")


class ScriptedServer:
    """A raw socket peer that answers each frame it reads with bytes a test chose.

    Used for replies the real server would never write (newer family, bad ``n``,
    oversized frames, hang-ups), which is exactly what a client must survive.
    """

    def __init__(
        self, path: Path, script: Callable[[bytes], bytes | None], *, hangup: bool = False
    ) -> None:
        self.hangup = hangup
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.script = script
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                while True:
                    header = _recv_exact(conn, 4)
                    if header is None:
                        break
                    body = _recv_exact(conn, struct.unpack(">I", header)[0]) or b""
                    out = self.script(body)
                    if out is None:
                        break
                    conn.sendall(out)
                    if self.hangup:
                        break

    def close(self) -> None:
        self.sock.close()


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        part = conn.recv(n - len(buf))
        if not part:
            return None
        buf += part
    return buf


def frame(obj: Any) -> bytes:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


@pytest.fixture
def regdir() -> Iterator[Path]:
    """A short private directory standing in for one project's registry."""
    d = Path(tempfile.mkdtemp(prefix="ml-", dir="/tmp"))
    d.chmod(0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def session(regdir: Path) -> Iterator[SessionServer]:
    server = SessionServer(regdir / "beta-nu")
    yield server
    server.close()


def lua_for(flavour: str, regdir: Path, **kw: Any) -> Lua:
    return Lua(flavour, settings={"dir": str(regdir), "from": "alpha-rho"}, **kw)


# -- melchior lua-api -----------------------------------------------------------------------


def test_lua_api_prints_the_shipped_client(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "melchior.cli", "lua-api"], capture_output=True, check=True
    )
    assert out.stdout == CLIENT
    assert out.stdout.startswith(b"--[[")

    target = tmp_path / "melchior.lua"
    target.write_bytes(b"old")
    done = subprocess.run(
        [sys.executable, "-m", "melchior.cli", "lua-api", "--output", str(target)],
        capture_output=True,
    )
    assert done.returncode == 0
    assert done.stdout == b""
    assert target.read_bytes() == CLIENT
    assert [p.name for p in tmp_path.iterdir()] == ["melchior.lua"]  # no temp file left


def test_lua_api_output_into_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "melchior.lua"
    done = subprocess.run(
        [sys.executable, "-m", "melchior.cli", "lua-api", "--output", str(missing)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "does not exist" in done.stderr
    assert not missing.parent.exists()


def test_emitted_lua_uses_no_other_tag_key() -> None:
    """gate-wire's rule applied to the emitted Lua: no table key spelled like a rival tag."""
    import re

    text = CLIENT.decode()
    keys = "|".join(FORBIDDEN_TAGS)
    assert not re.findall(rf"(?<![\w.])(?:{keys})\b\s*=(?!=)", text)
    assert not re.findall(rf'\[\s*"(?:{keys})"\s*\]', text)
    assert not re.findall(rf"(?<!math)\.(?:{keys})\b", text)
    assert "msg.event" in text  # the one tag it reads


# -- the seed's usage, over a real socket, on every Lua -------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_seed_usage(flavour: str, regdir: Path, session: SessionServer) -> None:
    lua = lua_for(flavour, regdir)
    got = lua.run(
        """
        local melchior = ...
        local them = melchior.connect("beta-nu")
        local st = them.status()
        local receipt = them.tell("the parser is done", "attention")
        them:close()
        return st, receipt, tostring(st)
        """
    )
    status, receipt, shown = got
    assert lua.to_py(status) == {
        "id": "beta-nu",
        "project": "demo",
        "role": "main",
        "parent": None,
        "busy": False,
        "working_for": 0,
        "waiting": 0,
    }
    assert json.loads(shown)["id"] == "beta-nu"  # print(them.status()) shows JSON
    assert lua.to_py(receipt) == {"receipt": "delivered", "message_id": "m-1"}
    assert [c["call"] for c in session.calls] == ["status", "tell"]
    tell = session.calls[1]
    assert tell["args"] == ["the parser is done", "attention"]
    assert tell["from"] == "alpha-rho"
    assert lua.streams[0].closed


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_verb_and_both_call_styles(
    flavour: str, regdir: Path, session: SessionServer
) -> None:
    lua = lua_for(flavour, regdir)
    about, answered, verbs, plain = lua.run(
        """
        local melchior = ...
        local them = melchior.connect("beta-nu", {from = "iota-mu"})
        local asked = them:ask("is the parser done?")
        local answered = them.answer(asked.about, "yes")
        local verbs = {them.verbs()}
        local plain = them:tell("no sort")
        them.close()
        return asked.about, answered, melchior.array(verbs), plain
        """
    )
    assert about == b"beta-nu@m-1"
    assert lua.to_py(answered) == {"receipt": "delivered"}
    assert [v["name"] for v in lua.to_py(verbs)] == ["status", "tell", "ask", "answer", "verbs"]
    assert lua.to_py(plain)["receipt"] == "delivered"
    assert [c["args"] for c in session.calls] == [
        ["is the parser done?"],
        ["beta-nu@m-1", "yes"],
        [],
        ["no sort"],  # an omitted sort is not sent as null
    ]
    assert {c["from"] for c in session.calls} == {"iota-mu"}


def test_from_defaults_to_the_environment_id(regdir: Path, session: SessionServer) -> None:
    env = {"MAGI_MELCHIOR_ID": "kappa-pi"}
    lua = Lua("lua54", settings={"dir": str(regdir)})
    lua.run(
        "local m, env = ...; m.configure{getenv = function(k) return env[k] end}"
        "; m.connect('beta-nu').status()",
        lua.table(env),
    )
    assert session.calls[0]["from"] == "kappa-pi"


def test_configure_at_sets_directory_and_from(regdir: Path, session: SessionServer) -> None:
    lua = Lua("lua54")
    lua.run(
        "local m, at = ...; m.configure{at = at}; m.connect('beta-nu').status()",
        f"{regdir}/omega-xi",
    )
    assert session.calls[0]["from"] == "omega-xi"


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_refusal_is_a_lua_error_carrying_the_reason(
    flavour: str, regdir: Path, session: SessionServer
) -> None:
    lua = lua_for(flavour, regdir)
    ok, err, after, code = lua.run(
        """
        local melchior = ...
        local them = melchior.connect("beta-nu")
        local ok, err = pcall(them.call, "refuse")
        local after = them.status().id          -- a refusal leaves the connection usable
        local reply = them.reply("refuse")      -- the raw reply, for programs that branch
        them:close()
        return ok, err, after, reply.error.code
        """
    )
    assert ok is False
    assert err.decode() == (
        "melchior: beta-nu refused refuse: the instance wall: beta-nu is private to its main"
        " [walls]"
    )
    assert after == b"beta-nu"
    assert code == b"walls"
    assert len(lua.streams) == 1  # one connection served all of it


def test_unknown_verb_and_bad_arguments_are_refused(regdir: Path, session: SessionServer) -> None:
    lua = lua_for("lua54", regdir)
    with pytest.raises(LuaError) as exc:
        lua.run("local m = ...; m.connect('beta-nu').call('fly')")
    assert "refused fly: unknown verb 'fly' [unknown-verb]" in lua_error(exc.value)
    with pytest.raises(LuaError) as exc:
        lua.run("local m = ...; m.connect('beta-nu').tell(42)")
    assert "tell needs the text as a string, got number" in lua_error(exc.value)
    with pytest.raises(LuaError) as exc:
        lua.run("local m = ...; m.connect('beta-nu').call('tell', 'a', 'b', 'c')")
    assert "[bad-args]" in lua_error(exc.value)


def test_a_closed_handle_refuses_further_calls(regdir: Path, session: SessionServer) -> None:
    lua = lua_for("lua54", regdir)
    with pytest.raises(LuaError) as exc:
        lua.run("local m = ...; local t = m.connect('beta-nu'); t:close(); t.status()")
    assert lua_error(exc.value) == "melchior: the connection to beta-nu is closed"


# -- reaching nobody ------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_nobody_there_is_a_clear_error(flavour: str, regdir: Path) -> None:
    lua = lua_for(flavour, regdir)
    with pytest.raises(LuaError) as exc:
        lua.run("local m = ...; m.connect('gamma-mu')")
    msg = lua_error(exc.value)
    assert msg.startswith(f"melchior: cannot reach gamma-mu at {regdir}/gamma-mu: ")
    assert "No such file" in msg


def test_stale_socket_and_opener_returning_nil(regdir: Path) -> None:
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(regdir / "delta-nu"))  # bound, never listening: what a killed serve leaves
    dead.close()
    lua = lua_for("lua54", regdir)
    with pytest.raises(LuaError) as exc:
        lua.run("local m = ...; m.connect('delta-nu')")
    assert "Connection refused" in lua_error(exc.value)
    ok, err = lua.run(
        "local m = ...; m.configure{stream = function(p) return nil, 'no sockets here' end}"
        "; return pcall(m.connect, 'delta-nu')"
    )
    assert ok is False
    assert err.decode() == f"melchior: cannot reach delta-nu at {regdir}/delta-nu: no sockets here"


def test_not_an_id_and_no_registry(regdir: Path) -> None:
    lua = Lua("lua54", settings={"getenv": None})
    with pytest.raises(LuaError) as exc:
        lua.run("local m = ...; m.configure{getenv = function() return nil end}; m.connect('x y')")
    assert '"x y" is not a session id' in lua_error(exc.value)
    with pytest.raises(LuaError) as exc:
        lua.run("local m = ...; m.connect('beta-nu')")
    assert "cannot tell which registry to use" in lua_error(exc.value)


# -- the family rule and malformed replies ---------------------------------------------------


def _reply_with(obj: Any) -> Callable[[bytes], bytes]:
    def script(body: bytes) -> bytes:
        call = json.loads(body)
        out = dict(obj)
        if out.pop("echo_id", False):
            out["id"] = call["id"]
        return frame(out)

    return script


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_newer_family_is_refused(flavour: str, regdir: Path) -> None:
    server = ScriptedServer(
        regdir / "beta-nu", _reply_with({"ok": True, "family": 2, "n": 1, "result": [{}]})
    )
    try:
        lua = lua_for(flavour, regdir)
        with pytest.raises(LuaError) as exc:
            lua.run("local m = ...; m.connect('beta-nu').status()")
        assert lua_error(exc.value) == (
            "melchior: beta-nu replied in family 2, newer than this client knows (1); "
            "get a newer client from 'melchior lua-api'"
        )
    finally:
        server.close()


def test_an_older_family_is_tolerated(regdir: Path) -> None:
    """A client of family 2 (the same file, its constant raised) reads family-1 replies."""
    newer = CLIENT.replace(b"local FAMILY = 1\n", b"local FAMILY = 2\n")
    assert newer != CLIENT
    server = ScriptedServer(
        regdir / "beta-nu",
        _reply_with({"ok": True, "family": 1, "n": 1, "result": [{"busy": True}]}),
    )
    try:
        lua = Lua("lua54", src=newer, settings={"dir": str(regdir)})
        got = lua.run("local m = ...; return m.family, m.connect('beta-nu').status().busy")
        assert got == (2, True)
    finally:
        server.close()


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ({"ok": True, "family": 1, "n": 2, "result": [1]}, "reply 'n' is 2 but 'result' holds 1"),
        ({"ok": True, "family": 1, "n": 1, "result": {"a": 1}}, "reply 'result' must be a list"),
        ({"ok": "yes", "family": 1, "n": 0, "result": []}, "has no 'ok' true or false"),
        ({"ok": True, "family": 0, "n": 0, "result": []}, "'family' must be a positive integer"),
        ({"call": "status", "args": []}, "sent a call where a reply to status was expected"),
        ({"ok": True, "family": 1, "n": 0, "result": [], "id": "lua-9"}, "answered call lua-9"),
    ],
)
def test_malformed_replies_are_errors(regdir: Path, reply: JSONObject, message: str) -> None:
    server = ScriptedServer(regdir / "beta-nu", _reply_with(reply))
    try:
        lua = lua_for("lua54", regdir)
        with pytest.raises(LuaError) as exc:
            lua.run("local m = ...; m.connect('beta-nu').status()")
        assert message in lua_error(exc.value)
    finally:
        server.close()


def test_after_a_malformed_reply_the_next_call_starts_afresh(regdir: Path) -> None:
    replies = iter(
        [
            frame({"ok": True, "family": 2, "n": 0, "result": []}),  # refused by the client
            frame({"ok": True, "family": 1, "n": 1, "result": ["fresh"]}),
        ]
    )
    server = ScriptedServer(regdir / "beta-nu", lambda body: next(replies))
    try:
        lua = lua_for("lua54", regdir)
        ok, err, fresh = lua.run(
            "local m = ...; local t = m.connect('beta-nu'); local ok, err = pcall(t.status)"
            "; return ok, err, t.status()"
        )
        assert ok is False
        assert b"family 2" in err
        assert fresh == b"fresh"
        assert len(lua.streams) == 2
        assert lua.streams[0].closed
    finally:
        server.close()


def test_events_before_a_reply_are_handed_over_not_mistaken(regdir: Path) -> None:
    def script(body: bytes) -> bytes:
        cid = json.loads(body)["id"]
        return frame({"event": "doing", "busy": True}) + frame(
            {"ok": True, "family": 1, "n": 1, "result": [{"busy": True}], "id": cid}
        )

    server = ScriptedServer(regdir / "beta-nu", script)
    try:
        lua = lua_for("lua54", regdir)
        seen, busy = lua.run(
            """
            local m = ...
            local seen = m.array()
            local them = m.connect('beta-nu', {on_event = function(e) seen[#seen + 1] = e end})
            return seen, them.status().busy
            """
        )
        assert busy is True
        assert lua.to_py(seen) == [{"event": "doing", "busy": True}]
    finally:
        server.close()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (struct.pack(">I", 0), "sent a frame of 0 bytes"),
        (struct.pack(">I", 2048), "sent a frame of 2048 bytes (limit 1024); the framing is lost"),
        (struct.pack(">I", 100) + b'{"ok":', "closed the connection inside a frame (6 of 100"),
        (b"", "closed the connection before replying"),
        (frame(b"\xff\xfe{}"), "unreadable reply: melchior: JSON text is not UTF-8"),
        (frame(b"[1,2]"), "a message must be a JSON object"),
    ],
)
def test_broken_framing_is_an_error_not_a_hang(regdir: Path, raw: bytes, message: str) -> None:
    server = ScriptedServer(regdir / "beta-nu", lambda body: raw or None, hangup=True)
    try:
        lua = Lua("lua54", settings={"dir": str(regdir), "limit": 1024})
        with pytest.raises(LuaError) as exc:
            lua.run("local m = ...; m.connect('beta-nu').status()")
        assert message in lua_error(exc.value)
    finally:
        server.close()


def test_a_dropped_connection_is_reopened_by_the_next_call(regdir: Path) -> None:
    def script(body: bytes) -> bytes:
        cid = json.loads(body)["id"]
        return frame({"ok": True, "family": 1, "n": 1, "result": [{"busy": False}], "id": cid})

    server = ScriptedServer(regdir / "beta-nu", script, hangup=True)  # one reply per connection
    try:
        lua = lua_for("lua54", regdir)
        first, second, third = lua.run(
            """
            local m = ...
            local them = m.connect('beta-nu')
            local first = them.status().busy
            local ok, err = pcall(them.status)
            return first, err, them.status().busy
            """
        )
        assert first is False
        assert third is False
        assert second.startswith(b"melchior: beta-nu: ")
        assert len(lua.streams) == 2
    finally:
        server.close()


def test_the_client_refuses_to_send_over_its_limit(regdir: Path, session: SessionServer) -> None:
    lua = Lua("lua54", settings={"dir": str(regdir), "limit": 100})
    with pytest.raises(LuaError) as exc:
        lua.run("local m = ...; m.connect('beta-nu').tell(string.rep('x', 200))")
    assert "over the 100-byte frame limit" in lua_error(exc.value)
    assert session.calls == []


# -- payloads: big, unicode, nested, numbers -------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_big_payloads_in_small_reads_and_partial_writes(
    flavour: str, regdir: Path, session: SessionServer
) -> None:
    big = "".join(chr(0x41 + i % 26) for i in range(3 * 1024 * 1024)) + "é😀"
    lua = lua_for(flavour, regdir, chunk=65536, partial=100_000)
    got = lua.run("local m, big = ...; return m.connect('beta-nu').call('echo', big)", big)
    assert got == big.encode()
    assert session.calls[0]["args"] == [big]


UNICODE = [
    "héllo wörld",
    "日本語のテキスト",
    "emoji 😀🎉 and a flag 🇫🇷",
    'quotes " and \\ backslash / slash',
    "controls \x00 \x01 \x1f \t \n \r \b \f del \x7f",
    "\u2028\u2029 line separators",
    "\ufeff a BOM inside",
    "",
]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_unicode_round_trips(flavour: str, regdir: Path, session: SessionServer) -> None:
    lua = lua_for(flavour, regdir)
    got = lua.run(
        "local m, t = ...; return m.array({m.connect('beta-nu').call('echo',"
        " (table.unpack or unpack)(t))})",
        lua.rt.table(*[s.encode() for s in UNICODE]),
    )
    assert lua.to_py(got) == UNICODE
    assert session.calls[0]["args"] == UNICODE


NESTED: Any = {
    "list": [1, [2, [3, [4, []]]], {}, {"k": None}],
    "object": {"a": {"b": {"c": {"d": [True, False, None]}}}},
    "empty": {"o": {}, "a": []},
    "keys": {"": 1, "ü": 2, "with space": 3, "1": 4},
}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_nested_json_round_trips(flavour: str, regdir: Path, session: SessionServer) -> None:
    lua = lua_for(flavour, regdir)
    them = lua.run("local m = ...; return m.connect('beta-nu')")
    decoded = lua.run("local m, text = ...; return m.decode(text)", json.dumps(NESTED))
    back = lua.run("local m, them, v = ...; return them.call('echo', v)", them, decoded)
    assert lua.to_py(back) == NESTED
    assert session.calls[0]["args"] == [NESTED]  # what the Lua encoder put on the wire


NUMBERS = [
    0,
    -1,
    42,
    2**31,
    2**53 + 1,
    2**63 - 1,
    -(2**63),
    0.5,
    -0.1,
    1e300,
    5e-324,
    3.0,
    123456789.125,
]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_numbers_keep_their_kind(flavour: str, regdir: Path, session: SessionServer) -> None:
    lua = lua_for(flavour, regdir)
    them = lua.run("local m = ...; return m.connect('beta-nu')")
    values = lua.run("local m, text = ...; return m.decode(text)", json.dumps(NUMBERS))
    back, kinds = lua.run(
        """
        local m, them, v = ...
        local back = m.array({them.call('echo', (table.unpack or unpack)(v))})
        local kinds = m.array()
        for i, x in ipairs(back) do kinds[i] = math.type and math.type(x) or 'number' end
        return back, kinds
        """,
        them,
        values,
    )
    got = lua.to_py(back)
    echoed = session.calls[0]["args"]
    if lua.integers:
        assert [lua.to_py(k) for k in kinds.values()] == [
            "integer" if isinstance(n, int) else "float" for n in NUMBERS
        ]
        for want, have, wire in zip(NUMBERS, got, echoed, strict=True):
            assert type(have) is type(want)
            assert have == want
            assert type(wire) is type(want)
            assert wire == want
    else:  # doubles only: exact up to 2**53, nearest double beyond
        for want, have in zip(NUMBERS, got, strict=True):
            assert have == float(want)


def test_integers_past_64_bits_become_the_nearest_double(regdir: Path) -> None:
    lua = Lua("lua54")
    kind, value = lua.run(
        "local m, t = ...; local v = m.decode(t); return math.type(v[1]), v[1]",
        "[18446744073709551616]",
    )
    assert kind == b"float"
    assert value == float(2**64)


# -- JSON: the property and the refusals ---------------------------------------------------


def _json_values(int_bound: int) -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-int_bound, max_value=int_bound - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text()
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
        ),
        max_leaves=25,
    )


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same JSON kind all the way down (an int is not a float)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


LUA54 = Lua("lua54")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json_values(2**63))
def test_json_round_trip_property_lua54(value: Any) -> None:
    """Python encodes, Lua decodes (checked independently), Lua encodes, Python decodes."""
    text = json.dumps(value, ensure_ascii=False)
    decoded = LUA54.run("local m, t = ...; return m.decode(t)", text)
    assert _same(LUA54.to_py(decoded), value)
    again = LUA54.run("local m, v = ...; return m.encode(v)", decoded)
    assert _same(json.loads(again.decode("utf-8")), value)
    ascii_text = json.dumps(value, ensure_ascii=True)  # \u escapes, surrogate pairs
    assert _same(LUA54.to_py(LUA54.run("local m, t = ...; return m.decode(t)", ascii_text)), value)


LUAJIT = Lua(next((f for f in FLAVOURS if f.startswith("luajit")), "lua51"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json_values(2**53))
def test_json_round_trip_property_doubles_only(value: Any) -> None:
    """On a Lua with doubles only, values survive (an integral float may come back an int)."""
    text = json.dumps(value, ensure_ascii=False)
    decoded = LUAJIT.run("local m, t = ...; return m.decode(t)", text)
    again = json.loads(LUAJIT.run("local m, v = ...; return m.encode(v)", decoded).decode())
    assert again == value


@pytest.fixture(scope="module")
def echo_session() -> Iterator[SessionServer]:
    d = Path(tempfile.mkdtemp(prefix="ml-", dir="/tmp"))
    server = SessionServer(d / "beta-nu")
    yield server
    server.close()
    shutil.rmtree(d, ignore_errors=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=_json_values(2**63),
    chunk=st.integers(min_value=1, max_value=64),
    partial=st.integers(min_value=1, max_value=64),
)
def test_values_cross_the_socket_whatever_the_host_reads_and_writes_at_once(
    echo_session: SessionServer, value: Any, chunk: int, partial: int
) -> None:
    """The host may hand back any number of bytes per read and send any prefix per write."""
    lua = Lua("lua54", chunk=chunk, partial=partial)
    text = json.dumps([value], ensure_ascii=False)
    back = lua.run(
        "local m, path, text = ...; local t = m.connect(path)"
        "; local r = m.array({t.call('echo', m.decode(text)[1])}); t:close(); return r",
        str(echo_session.path),
        text,
    )
    assert _same(lua.to_py(back), [value])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1,]", "unexpected character"),
        ("[01]", "leading zero"),
        ('{"a" 1}', "expected ':'"),
        ("{'a': 1}", "expected a string key"),
        ('"\\ud800"', "lone surrogate"),
        ('"\\udc00x"', "lone surrogate"),
        ('"a\nb"', "raw control character"),
        ('"\\x41"', "unknown escape"),
        ('"\\u12"', "four hex digits"),
        ("NaN", "unexpected character"),
        ("1.", "digits must follow a decimal point"),
        ("1e", "digits must follow an exponent"),
        ('"abc', "unterminated string"),
        ("[1] 2", "trailing characters"),
        ("", "unexpected end"),
        ("[" * 600 + "]" * 600, "nested deeper than 512"),
        ("tru", "unexpected character"),
    ],
)
def test_decode_refuses_what_is_not_json(text: str, message: str) -> None:
    with pytest.raises(LuaError) as exc:
        LUA54.run("local m, t = ...; return m.decode(t)", text)
    msg = lua_error(exc.value)
    assert msg.startswith("melchior: ")
    assert message in msg


def test_decode_refuses_bytes_that_are_not_utf8() -> None:
    for raw in (b'"\xff"', b'"\xc0\x80"', b'"\xed\xa0\x80"', b'"\xf4\x90\x80\x80"', b'"\xe2\x82"'):
        with pytest.raises(LuaError) as exc:
            LUA54.run("local m, t = ...; return m.decode(t)", raw)
        assert "not UTF-8" in lua_error(exc.value)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("return m.encode(0/0)", "JSON has no NaN or infinity"),
        ("return m.encode(math.huge)", "JSON has no NaN or infinity"),
        ("return m.encode('\\255')", "not UTF-8"),
        ("return m.encode({print})", "cannot encode a function"),
        ("return m.encode({1, 2, x = 3})", "as a JSON array"),
        ("return m.encode({[1.5] = 1})", "as a JSON array"),
        ("return m.encode(m.object({1}))", "as a JSON object"),
        ("local t = {}; t.t = t; return m.encode(t)", "nested deeper than 512"),
    ],
)
def test_encode_refuses_what_json_cannot_say(code: str, message: str) -> None:
    with pytest.raises(LuaError) as exc:
        LUA54.run("local m = ...; " + code)
    assert message in lua_error(exc.value)


def test_encode_marks_and_defaults() -> None:
    got = LUA54.run(
        "local m = ...; return m.encode({{}, m.array(), m.object(), {1, 2}, {b = 1, a = m.null}})"
    )
    assert got == b'[{},[],{},[1,2],{"a":null,"b":1}]'


# -- discovery -----------------------------------------------------------------------------


def _bind(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(1)
    return s


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_discovery_lists_sockets_not_notes(flavour: str, regdir: Path) -> None:
    socks = [_bind(regdir / name) for name in ("alpha-rho", "iota-mu", "beta-nu-chi")]
    try:
        (regdir / "iota-mu.parent").write_text("alpha-rho\n")
        (regdir / ".used").write_text("alpha-rho\niota-mu\n")
        (regdir / ".lock").write_text("")
        _bind(regdir / ".omega-pi.tmp").close()
        lua = lua_for(flavour, regdir)
        lua.run(
            "local m, listdir = ...; m.configure{list = function(d) return listdir(d) end}",
            lambda d: lua.rt.table(*os.listdir(d)),
        )
        ids, parent, none = lua.run(
            "local m = ...; return m.list(), m.parent('iota-mu'), m.parent('alpha-rho')"
        )
        assert lua.to_py(ids) == ["alpha-rho", "beta-nu-chi", "iota-mu"]
        assert parent == b"alpha-rho"
        assert none is None
    finally:
        for s in socks:
            s.close()


def test_discovery_by_io_popen_where_the_lua_has_it(regdir: Path) -> None:
    """The default lister shells out to ls; LuaJIT in lupa has io.popen, lupa's PUC Luas not."""
    sock = _bind(regdir / "alpha-rho")
    try:
        (regdir / "alpha-rho.parent").write_text("iota-mu")
        jit = next((f for f in FLAVOURS if f.startswith("luajit")), None)
        if jit is not None:
            lua = lua_for(jit, regdir)
            assert lua.to_py(lua.run("local m = ...; return m.list()")) == ["alpha-rho"]
        lua = lua_for("lua54", regdir)
        ok, err = lua.run("local m = ...; return pcall(m.list)")
        if ok is False:  # a Lua without io.popen says what to do instead
            assert b"needs io.popen" in err
            assert b"configure{list=" in err
    finally:
        sock.close()


def test_discovery_from_the_environment_and_a_host_lister(regdir: Path) -> None:
    # A short runtime dir: under pytest's long tmp_path melchior itself would hash "demo".
    tmp_path = regdir
    env = {"XDG_RUNTIME_DIR": str(tmp_path), "MAGI_MELCHIOR_PROJECT": "demo"}
    lua = Lua("lua54")
    listed: list[bytes] = []

    def lister(d: bytes) -> Any:
        listed.append(d)
        return lua.rt.table(b"alpha-rho", b"alpha-rho.parent", b".lock")

    ids, where = lua.run(
        "local m, env, list = ...; m.configure{getenv = function(k) return env[k] end,"
        " list = function(d) return list(d) end}; return m.list(), m.dir()",
        lua.table(env),
        lister,
    )
    assert lua.to_py(ids) == ["alpha-rho"]
    assert where.decode() == f"{tmp_path}/melchior/demo"
    assert listed == [f"{tmp_path}/melchior/demo".encode()]


def test_reachable_probes_with_status(regdir: Path, session: SessionServer) -> None:
    lua = lua_for("lua54", regdir)
    assert lua.run("local m = ...; return m.reachable('beta-nu')") is True
    ok, err = lua.run("local m = ...; return m.reachable('zeta-xi')")
    assert ok is False
    assert b"cannot reach zeta-xi" in err


# -- wire fixtures and gate-wire -------------------------------------------------------------


def _transcript(streams: list[PyStream]) -> bytes:
    """The traffic a Lua session put on the socket, as NDJSON: call, reply, call, reply."""
    lines = []
    for s in streams:
        calls = list(FrameDecoder().feed(bytes(s.sent)))
        replies = list(FrameDecoder().feed(bytes(s.received)))
        assert len(calls) == len(replies)
        for c, r in zip(calls, replies, strict=True):
            lines += [json.dumps(c, ensure_ascii=False), json.dumps(r, ensure_ascii=False)]
    return ("\n".join(lines) + "\n").encode()


def test_lua_traffic_matches_its_fixture_and_passes_gate_wire(
    regdir: Path, session: SessionServer
) -> None:
    lua = lua_for("lua54", regdir)
    lua.run(
        """
        local m = ...
        local them = m.connect('beta-nu')
        them.status()
        them.tell('the parser is done', 'attention')
        local q = them.ask('is the lexer done?')
        them.answer(q.about, 'yes, since noon')
        them.verbs()
        pcall(them.call, 'refuse')
        them:close()
        """
    )
    got = _transcript(lua.streams)
    fixture = FIXTURES / "lua_client.ndjson"
    if os.environ.get("MELCHIOR_REGEN_FIXTURES") == "1":
        fixture.write_bytes(got)
    assert got == fixture.read_bytes(), "regenerate with MELCHIOR_REGEN_FIXTURES=1 if intended"


def test_gate_wire_passes_every_wire_fixture(tmp_path: Path) -> None:
    fixtures = sorted(FIXTURES.glob("*.ndjson"))
    assert fixtures
    done = subprocess.run(
        [sys.executable, "-m", "melchior.cli", "gate-wire", *map(str, fixtures)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # and the gate can fail: a rival tag key in a copy of a fixture is refused
    bad = tmp_path / "bad.ndjson"
    bad.write_text('{"type":"listening","at":"x"}\n')
    refused = subprocess.run(
        [sys.executable, "-m", "melchior.cli", "gate-wire", str(bad)], capture_output=True
    )
    assert refused.returncode == 1


# -- against a live `melchior serve` ---------------------------------------------------------


class LiveServe:
    """A real ``melchior serve`` child on pipes, as a harness runs it."""

    def __init__(self, env: dict[str, str]) -> None:
        import queue

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "melchior.cli", "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.lines: list[bytes] = []
        self._events: queue.Queue[JSONObject | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        first = self.event()
        assert first["event"] == "listening", first
        self.at: str = first["at"]
        self.id = self.at.rsplit("/", 1)[1]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self._events.put(json.loads(line))
        self._events.put(None)

    def event(self) -> JSONObject:
        got = self._events.get(timeout=30)  # a hang guard, not a threshold
        if got is None:
            assert self.proc.stderr is not None
            raise AssertionError(f"serve ended: {self.proc.stderr.read().decode()}")
        return got

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(30)


@pytest.fixture
def live_env(runtime_dir: Path, tmp_path: Path) -> dict[str, str]:
    if importlib.util.find_spec("melchior.commands.serve") is None:
        pytest.skip("melchior serve is not in this tree yet")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAGI_MELCHIOR_")}
    env.update(
        XDG_RUNTIME_DIR=str(runtime_dir),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        MAGI_MELCHIOR_PROJECT="demo",
    )
    return env


@pytest.mark.parametrize("flavour", ["lua54", "luajit21"])
def test_lua_against_a_live_session(flavour: str, live_env: dict[str, str]) -> None:
    if flavour not in FLAVOURS:
        pytest.skip(f"lupa has no {flavour} here")
    from melchior.wire.gate import scan_lines

    alpha, beta = LiveServe(live_env), LiveServe(live_env)
    try:
        # The host is alpha's harness: it knows its registry and id from listening.at.
        lua = Lua(flavour, settings={"at": alpha.at})
        lua.run(
            "local m, listdir = ...; m.configure{list = function(d) return listdir(d) end}",
            lambda d: lua.rt.table(*os.listdir(d)),
        )
        ids, status, receipt, about, verbs = lua.run(
            """
            local melchior, beta = ...
            local them = melchior.connect(beta)
            local st = them.status()
            local receipt = them.tell("the parser is done", "attention")
            local q = them.ask("is the lexer done?")
            local verbs = melchior.array({them.verbs()})
            them:close()
            return melchior.list(), st, receipt, q.about, verbs
            """,
            beta.id,
        )
        assert lua.to_py(ids) == sorted([alpha.id, beta.id])
        st = lua.to_py(status)
        assert st["id"] == beta.id
        assert st["project"] == "demo"
        assert st["role"] == "main"
        assert set(st) >= {"id", "project", "role", "parent", "busy", "working_for", "waiting"}
        assert lua.to_py(receipt)["receipt"] in ("delivered", "queued")
        names_ = {v["name"] for v in lua.to_py(verbs)}
        assert names_ >= {"status", "tell", "ask", "answer", "verbs"}  # the client's verbs

        told = beta.event()
        assert told["event"] == "message"
        assert told["sort"] == "attention"
        assert told["text"] == "the parser is done"
        assert told["who"] == f"demo/main/{alpha.id}"
        asked = beta.event()
        assert asked["sort"] == "question"
        assert asked["about"] == about.decode()

        # beta's harness answers through its own client; alpha's serve records it.
        as_beta = Lua(flavour, settings={"at": beta.at})
        as_beta.run(
            "local m, a, about = ...; local t = m.connect(a); t.answer(about, 'yes'); t:close()",
            alpha.id,
            about,
        )
        answered = alpha.event()
        assert answered["sort"] == "answer"
        assert answered["text"] == "yes"
        task = lua.run("local m, a, about = ...; return m.connect(a):task(about)", alpha.id, about)
        assert lua.to_py(task)["state"] == "answered"

        # a refusal from the real thing is a Lua error with its reason
        ok, err = lua.run("local m, b = ...; return pcall(m.connect(b).call, 'fly')", beta.id)
        assert ok is False
        assert b"refused fly" in err
        assert b"[unknown-verb]" in err

        traffic = _transcript(lua.streams + as_beta.streams)
        assert scan_lines("lua<->serve", traffic) == []
        assert scan_lines("serve stdout", b"".join(alpha.lines + beta.lines)) == []
    finally:
        assert beta.close() == 0
        alpha.close()
    with pytest.raises(LuaError) as exc:  # beta's harness is gone, and so is its name
        lua.run("local m, b = ...; m.connect(b)", beta.id)
    assert f"cannot reach {beta.id}" in lua_error(exc.value)


def test_the_walls_of_a_live_session_reach_lua_as_errors(live_env: dict[str, str]) -> None:
    """A forked sub is private to its instance: its parent reaches it, another main does not."""
    alpha, beta = LiveServe(live_env), LiveServe(live_env)
    child = None
    try:
        forked = subprocess.run(
            [sys.executable, "-m", "melchior.cli", "fork"],
            env=dict(live_env, MAGI_MELCHIOR_ID=alpha.id),
            capture_output=True,
            check=True,
        )
        child = LiveServe(dict(live_env, **json.loads(forked.stdout)["environment"]))
        as_alpha = Lua("lua54", settings={"at": alpha.at})
        receipt = as_alpha.run("local m, c = ...; return m.connect(c).tell('hi')", child.id)
        assert as_alpha.to_py(receipt)["receipt"] in ("delivered", "queued")
        assert child.event()["text"] == "hi"

        as_beta = Lua("lua54", settings={"at": beta.at})
        ok, err = as_beta.run("local m, c = ...; return pcall(m.connect(c).tell, 'hi')", child.id)
        assert ok is False
        assert err.decode().startswith(f"melchior: {child.id} refused tell: ")
        assert alpha.id in err.decode()  # the reason names the front door to go through
        assert err.decode().endswith("[refused]")
    finally:
        for s in (child, beta, alpha):
            if s is not None:
                s.close()


def _lua_dir(env: dict[str, str]) -> tuple[bool, str]:
    """What the client's environment discovery says: (True, dir) or (False, the error)."""
    lua = Lua("lua54")
    ok, out = lua.run(
        "local m, get = ...; m.configure{getenv = function(n) return get(n) end}; "
        "return pcall(m.dir)",
        lambda name: env[name.decode()].encode() if name.decode() in env else None,
    )
    return bool(ok), out.decode()


PROJECTS = st.one_of(
    st.text(alphabet="abcz09._-/", min_size=0, max_size=70),
    st.sampled_from(["demo", "a" * 64, "a" * 65, "x..y", "..", ".hidden", "-x", "ok.name"]),
)


@settings(max_examples=60, deadline=None)
@given(project=PROJECTS, depth=st.integers(0, 90), slash=st.booleans())
def test_environment_discovery_agrees_with_names_or_refuses(
    project: str, depth: int, slash: bool
) -> None:
    """The plain-Lua default never names a directory melchior would not use.

    Where melchior's own rule (names.registry_dir) moves a project somewhere the Lua
    client cannot compute (a hashed key, the /tmp fallback), the client refuses and
    asks for listening.at instead of guessing.
    """
    from melchior import names

    base = Path(tempfile.mkdtemp(prefix="ld-", dir="/tmp"))
    try:
        base.chmod(0o700)
        runtime = base / ("d" * depth) if depth else base
        runtime.mkdir(mode=0o700, exist_ok=True)
        env = {
            "XDG_RUNTIME_DIR": str(runtime) + ("/" if slash else ""),
            "MAGI_MELCHIOR_PROJECT": project,
        }
        try:
            expected: str | None = str(names.registry_dir(project, env))
        except names.NamingError:
            expected = None
        ok, said = _lua_dir(env)
        if ok:
            assert said == expected
        else:
            assert said.startswith("melchior: ")
            assert expected != f"{runtime}/melchior/{project}"  # a refusal only where it differs
            if expected is not None:
                assert "configure{at=<listening.at>}" in said
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_environment_discovery_without_a_runtime_dir_asks_for_listening_at() -> None:
    ok, said = _lua_dir({"MAGI_MELCHIOR_PROJECT": "demo"})
    assert not ok
    assert "/tmp/melchior-<uid>" in said
    assert "listening.at" in said
    ok, said = _lua_dir({"XDG_RUNTIME_DIR": "/run/user/1000"})
    assert not ok
    assert "MAGI_MELCHIOR_PROJECT is not set" in said


def test_a_live_session_with_a_hashed_project_key_is_reached_through_at(
    live_env: dict[str, str],
) -> None:
    """A project name too long for a socket path: melchior hashes it, `at` still finds it."""
    long_name = "a-rather-long-project-name-" + "x" * 37  # 64 bytes: valid, but hashed here
    env = dict(live_env, MAGI_MELCHIOR_PROJECT=long_name)
    runtime = Path(env["XDG_RUNTIME_DIR"]) / ("r" * 20)  # a longer base: the name cannot fit
    runtime.mkdir(mode=0o700)
    env["XDG_RUNTIME_DIR"] = str(runtime)
    alpha, beta = LiveServe(env), LiveServe(env)
    try:
        assert f"/melchior/{long_name}/" not in alpha.at
        assert "/melchior/h-" in alpha.at
        ok, said = _lua_dir(env)
        assert not ok
        assert "keys project" in said
        assert "listening.at" in said
        lua = Lua("lua54", settings={"at": alpha.at})
        st_ = lua.to_py(lua.run("local m, b = ...; return m.connect(b).status()", beta.id))
        assert st_["id"] == beta.id
        assert st_["project"] == long_name
    finally:
        beta.close()
        alpha.close()


LUA_VERBS = {"status": [], "tell": ["text", "sort?"], "ask": ["text"], "answer": ["about", "text"]}
LUA_VERBS.update(task=["about"], verbs=[])
"""The handle's named functions and the arguments each sends, in order."""


def test_the_named_functions_match_what_melchior_verbs_lists() -> None:
    """Contract drift shows here first: `melchior verbs` is what a session answers."""
    if importlib.util.find_spec("melchior.commands.verbs") is None:
        pytest.skip("melchior verbs is not in this tree yet")
    done = subprocess.run(
        [sys.executable, "-m", "melchior.cli", "verbs"], capture_output=True, check=True
    )
    listed = {v["name"]: v["args"] for v in json.loads(done.stdout)["result"]}
    for name, args in LUA_VERBS.items():
        assert listed.get(name) == args, (name, listed.get(name))
    src = CLIENT.decode()
    for name in LUA_VERBS:
        assert f"them.{name} = method(" in src
