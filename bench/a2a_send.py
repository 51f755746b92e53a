"""A2A through mellan vs the a2a-sdk reference server, same machine, same database engine.

Two numbers, each measured on both servers in the same run and printed with their ratio:

* **SendMessage accepted/s** — JSON-RPC ``SendMessage`` with
  ``configuration.returnImmediately``, ``CONCURRENCY`` clients, ``SENDS`` requests. On
  mellan a request is authenticated, grant-checked, audited and persisted as a queued
  task (no receiver is running: the work stays queued, as for an offline destination).
  On the reference (``DefaultRequestHandler`` + ``DatabaseTaskStore``) the executor
  emits the submitted Task, which the handler persists.
  The reference runs twice: with ``DatabaseTaskStore`` on the same engine, and with
  ``InMemoryTaskStore`` (no durability at all — the floor a durable queue is measured
  against). Beside the rate, each server's own CPU time per accepted request is printed
  (user + system of its process and threads, from ``/proc``): on a shared machine the
  rate moves with the neighbours' load, the CPU a request costs much less.
* **stream event latency** — ``SendStreamingMessage``; the producer emits ``EVENTS``
  status updates carrying ``time.time_ns()`` at emission and the streaming client
  records arrival. On mellan the producer is a receiver on the receiver API, in its own
  process (claim, then ``progress`` over HTTP: stored, then streamed); on the reference
  it is the in-process executor (its event queue).

Each server runs in its own process (this script with ``--serve``), each on a fresh
database of the same engine: PostgreSQL (``$MELCHIOR_TEST_PG``) and SQLite, in turn
(``BENCH_ENGINES=postgres,sqlite``). Run ``.venv/bin/python bench/a2a_send.py``; the
reference needs ``a2a-sdk[http-server,sqlite]`` (SQLAlchemy; psycopg for PostgreSQL).
With ``BENCH_PROFILE=DIR`` each server is sampled by py-spy while it accepts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # (the bench directory is not a package: found by the path above)

SENDS = int(os.environ.get("BENCH_SENDS", "1000"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "32"))
STREAMS = int(os.environ.get("BENCH_STREAMS", "20"))
EVENTS = int(os.environ.get("BENCH_EVENTS", "10"))
GAP = 0.1  # seconds between produced events: slower than either server handles one, so
# the latency measured is one event's trip, not a queue building up behind a fast producer

WS, CALLER, RECEIVER, CAP = "bench", "bench/caller", "bench/receiver", "bench.run"


# -- servers (child processes) -------------------------------------------------------------


def listener() -> Any:
    """A loopback listening socket with TCP_NODELAY (inherited by accepted connections on
    Linux): without it a response written in two parts waits out the peer's delayed ACK,
    which on this host adds ~40 ms to every request of *either* server."""
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def seed_bench_store(store: Any) -> dict[str, str]:
    """The bench's workspace in a fresh store: a caller granted the receiver's one
    capability, and an agent credential for each; their tokens by role."""
    from melchior.mellan.relay.auth import hash_token, new_token
    from melchior.mellan.relay.store.base import Capability, CredentialKind

    store.ensure_workspace(WS)
    store.add_agent(WS, CALLER, "bench caller", [])
    store.add_agent(WS, RECEIVER, "bench receiver", [Capability(CAP, "run")])
    store.add_grant(WS, CALLER, RECEIVER, [CAP])
    tokens = {}
    for who, subject in (("caller", CALLER), ("receiver", RECEIVER)):
        tokens[who] = new_token()
        store.add_credential(WS, CredentialKind.AGENT, subject, hash_token(tokens[who]))
    return tokens


def serve_mellan(db: str, info: Path) -> None:

    import uvicorn

    from melchior.mellan.relay.caches.limits import SendLimits
    from melchior.mellan.relay.context import Relay
    from melchior.mellan.relay.notify import LocalNotifier
    from melchior.mellan.relay.server.app import create_app
    from melchior.mellan.relay.server.serve import MAX_HEADER_BYTES, HeaderLimitedH11
    from melchior.mellan.relay.store import open_store
    from melchior.policy.send_limits import Limits

    notifier = LocalNotifier()
    store = open_store(db, publish=notifier.publish)
    tokens = seed_bench_store(store)
    sock = listener()
    sock.listen(2048)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    # the send limits are checked (their cost is measured) but set past the bench's load
    limits = SendLimits(Limits(1e6, 10**7, 10**7, 10**7))
    relay = Relay(store=store, notifier=notifier, public_url=url, limits=limits)
    info.write_text(json.dumps({"url": url, "rpc": f"{url}/a2a/{WS}/{RECEIVER}", **tokens}))
    config = uvicorn.Config(  # as `mellan relay` serves (relay/server/serve.py)
        create_app(relay),
        log_level="warning",
        http=HeaderLimitedH11,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        loop="asyncio",
    )
    uvicorn.Server(config).run(sockets=[sock])


def serve_reference(db: str, info: Path, memory: bool = False) -> None:

    import uvicorn
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_jsonrpc_routes
    from a2a.server.tasks import DatabaseTaskStore, InMemoryTaskStore, TaskUpdater
    from a2a.types import (
        AgentCapabilities,
        AgentCard,
        AgentInterface,
        Message,
        Part,
        Role,
        Task,
        TaskState,
        TaskStatus,
    )
    from sqlalchemy.ext.asyncio import create_async_engine
    from starlette.applications import Starlette

    class Executor(AgentExecutor):
        async def execute(self, ctx: RequestContext, q: EventQueue) -> None:
            task = Task(
                id=ctx.task_id,
                context_id=ctx.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[ctx.message],
            )
            await q.enqueue_event(task)
            if ctx.get_user_input() != "stream":
                return
            up = TaskUpdater(q, ctx.task_id, ctx.context_id)
            for _ in range(EVENTS):
                await asyncio.sleep(GAP)
                stamp = Message(
                    role=Role.ROLE_AGENT,
                    message_id=uuid.uuid4().hex,
                    parts=[Part(text=str(time.time_ns()))],
                )
                await up.update_status(TaskState.TASK_STATE_WORKING, message=stamp)
            await up.complete()

        async def cancel(self, ctx: RequestContext, q: EventQueue) -> None:
            await TaskUpdater(q, ctx.task_id, ctx.context_id).cancel()

    sock = listener()
    sock.listen(2048)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    card = AgentCard(
        name="reference",
        description="a2a-sdk reference server",
        version="1",
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        supported_interfaces=[
            AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0", url=url + "/")
        ],
    )
    store: InMemoryTaskStore | DatabaseTaskStore
    if memory:
        store = InMemoryTaskStore()
    elif db.startswith("postgresql://"):
        engine = create_async_engine(db.replace("postgresql://", "postgresql+psycopg://", 1))
        store = DatabaseTaskStore(engine)
    else:  # a generous busy timeout, or it fails under load (mellan: 10 s)
        path = db.removeprefix("sqlite://")
        engine = create_async_engine(f"sqlite+aiosqlite:///{path}", connect_args={"timeout": 30})
        store = DatabaseTaskStore(engine)
    if isinstance(store, DatabaseTaskStore):
        asyncio.run(store.initialize())
    handler = DefaultRequestHandler(agent_executor=Executor(), task_store=store, agent_card=card)
    app = Starlette(routes=create_jsonrpc_routes(handler, rpc_url="/"))
    info.write_text(json.dumps({"url": url, "rpc": url + "/", "caller": "", "receiver": ""}))
    # the same HTTP parser and loop as mellan's (uvicorn would pick httptools if present)
    config = uvicorn.Config(app, log_level="warning", http="h11", loop="asyncio")
    uvicorn.Server(config).run(sockets=[sock])


# -- driver ----------------------------------------------------------------------------------


def start(kind: str, db: str, tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    info = tmp / f"{kind}.json"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, "--db", db, "--info", str(info)]
    )
    deadline = time.monotonic() + 60
    while not info.exists() or not info.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{kind} server did not start")
        time.sleep(0.05)
    data: dict[str, str] = json.loads(info.read_text())
    for _ in range(200):
        try:
            httpx.get(data["url"] + "/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    return proc, data


def headers(token: str) -> dict[str, str]:
    h = {"A2A-Version": "1.0", "Content-Type": "application/json"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


def rpc(method: str, text: str, config: dict[str, Any] | None = None) -> bytes:
    params: dict[str, Any] = {
        "message": {
            "messageId": uuid.uuid4().hex,
            "role": "ROLE_USER",
            "parts": [{"text": text}],
        }
    }
    if config:
        params["configuration"] = config
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and all its threads so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Connection:
    """One keep-alive HTTP/1.1 connection that sends a POST and reads one response.

    The load generator must not be what is measured: httpx's async client spends ~4 ms of
    CPU per request here, more than either server, so on a 2-core machine the client set
    the pace. This writes a request with its headers prebuilt and reads a response by its
    Content-Length — about a tenth of that — and fails loudly on anything else."""

    def __init__(self, url: str, token: str) -> None:
        parts = httpx.URL(url)
        self.host, self.port, self.path = parts.host, parts.port or 80, parts.raw_path
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.head = (
            f"POST {self.path.decode()} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"A2A-Version: 1.0\r\nContent-Type: application/json\r\n{auth}"
        ).encode()

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, body: bytes) -> bytes:
        self.writer.write(b"%sContent-Length: %d\r\n\r\n%s" % (self.head, len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = head[9:12]
        length = None
        for line in head.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line[15:])
        if length is None:
            raise SystemExit(f"no Content-Length in {head!r}")
        payload = await self.reader.readexactly(length)
        if status != b"200" or b'"result"' not in payload:
            raise SystemExit(f"send failed: {head[:12]!r} {payload[:300]!r}")
        return payload

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def accepted_per_second(info: dict[str, str], pid: int) -> tuple[float, float, float]:
    """Accepted requests per second, the server's CPU milliseconds per request, and the
    load generator's own (to show it is not what sets the pace)."""
    conns = [Connection(info["rpc"], info["caller"]) for _ in range(CONCURRENCY)]
    for c in conns:
        await c.open()
    try:
        for c in conns:  # warm-up: every connection once
            await c.post(rpc("SendMessage", "warm", {"returnImmediately": True}))
        remaining = SENDS

        async def worker(c: Connection) -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await c.post(rpc("SendMessage", "work", {"returnImmediately": True}))

        c0, t0, mine = cpu_seconds(pid), time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pid) - c0
        client = (time.process_time() - mine) * 1000 / SENDS
        return SENDS / elapsed, cpu * 1000 / SENDS, client
    finally:
        for c in conns:
            await c.close()


def mellan_producer(info: dict[str, str]) -> None:
    """The receiver side for mellan's stream latency, in a process of its own as a receiver
    is (in the driver's process its HTTP client would share a GIL with the stream reader
    and delay both): stamp each event as it is sent. Runs until terminated."""
    from melchior.mellan.client.receiver import ReceiverClient

    with ReceiverClient(info["url"], info["receiver"]) as rc:
        while True:
            for lease in rc.claim(wait=0.5, limit=10):
                if (lease.payload or {}).get("parts", [{}])[0].get("text") != "stream":
                    rc.complete(lease.task_id, lease.epoch, {})
                    continue
                for _ in range(EVENTS):
                    time.sleep(GAP)
                    stamp = {"message": {"parts": [{"text": str(time.time_ns())}]}}
                    rc.progress(lease.task_id, lease.epoch, "status", stamp)
                rc.complete(lease.task_id, lease.epoch, {})


async def stream_latencies(info: dict[str, str]) -> list[float]:
    out: list[float] = []
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(STREAMS):
            body = rpc("SendStreamingMessage", "stream")
            async with client.stream(
                "POST", info["rpc"], content=body, headers=headers(info["caller"])
            ) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    arrived = time.time_ns()
                    ev = json.loads(line[5:])["result"]
                    upd = ev.get("statusUpdate")
                    msg = (upd or {}).get("status", {}).get("message")
                    if upd and msg and msg["parts"][0]["text"].isdigit():
                        out.append((arrived - int(msg["parts"][0]["text"])) / 1e6)
    return out


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


MEMORY = {"reference-memory": "memory://"}


@contextlib.contextmanager
def databases(engine: str, tmp: Path) -> Iterator[dict[str, str]]:
    """One fresh database per server, of the same engine."""
    with contextlib.ExitStack() as stack:
        urls = {
            k: stack.enter_context(_common.throwaway_database(engine, tmp / f"{k}.db", k))
            for k in ("mellan", "reference")
        }
        yield urls | MEMORY


PROFILE = os.environ.get("BENCH_PROFILE")


@contextlib.contextmanager
def profiled(pid: int, name: str) -> Iterator[None]:
    """With ``BENCH_PROFILE=DIR``, sample the server with py-spy while it accepts (collapsed
    stacks in DIR/NAME.txt, idle threads left out; ``pip install py-spy``)."""
    if not PROFILE:
        yield
        return
    out = Path(PROFILE) / f"{name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "250",
         "--output", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1)  # attached before the load starts
    try:
        yield
    finally:
        spy.send_signal(2)
        spy.wait(30)


def run_engine(engine: str) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as d, databases(engine, Path(d)) as dbs:
        tmp = Path(d)
        for kind in ("mellan", "reference", "reference-memory"):
            proc, info = start(kind, dbs[kind], tmp)
            producer = None
            try:
                with profiled(proc.pid, f"{engine}-{kind}"):
                    rate, cpu, client = asyncio.run(accepted_per_second(info, proc.pid))
                if kind == "mellan":
                    producer = subprocess.Popen(
                        [sys.executable, __file__, "--produce", "--info", str(tmp / "mellan.json")]
                    )
                lat = asyncio.run(stream_latencies(info))
            finally:
                if producer is not None:
                    producer.terminate()
                    producer.wait()
                proc.terminate()
                proc.wait()
            if len(lat) < STREAMS * EVENTS * 0.9:
                raise SystemExit(f"{kind}: only {len(lat)} of {STREAMS * EVENTS} events measured")
            results[kind] = {"rate": rate, "cpu": cpu, "client": client, "n": len(lat)}
            results[kind] |= {"p50": pct(lat, 50), "p95": pct(lat, 95)}
    return results


def reference_missing() -> str | None:
    """What the reference server needs that is not installed, if anything."""
    import importlib.util

    for module in ("sqlalchemy", "aiosqlite", "a2a.server.tasks"):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return module
    return None


def main() -> int:
    missing = reference_missing()
    if missing is not None:
        print(
            f"a2a_send: skipped — the a2a-sdk reference server needs {missing!r}; install "
            "'a2a-sdk[http-server,sqlite]>=1.3,<2' to compare against it"
        )
        return 0
    engines = os.environ.get("BENCH_ENGINES", "postgres,sqlite").split(",")
    for engine in engines:
        try:
            results = run_engine(engine)
        except Exception as exc:  # e.g. PostgreSQL not running: say so, measure the rest
            print(f"[{engine}] skipped: {exc}")
            continue
        report(engine, results)
    return 0


def report(engine: str, results: dict[str, dict[str, float]]) -> None:
    m = results["mellan"]
    print(f"[{engine}] A2A SendMessage (returnImmediately), {SENDS} sends, {CONCURRENCY} clients")
    print(f"  {'mellan':18} {m['rate']:7.0f} accepted/s  {m['cpu']:6.2f} ms CPU/request")
    print(f"  (load generator: {m['client']:.2f} ms CPU/request)")
    for kind in ("reference", "reference-memory"):
        r = results[kind]
        print(
            f"  {kind:18} {r['rate']:7.0f} accepted/s  {r['cpu']:6.2f} ms CPU/request"
            f"   mellan/{kind}: rate {m['rate'] / r['rate']:.2f}x, CPU {m['cpu'] / r['cpu']:.2f}x"
        )
    print(f"stream event latency, {STREAMS} streams x {EVENTS} events (ms)")
    for k in ("p50", "p95"):
        line = f"  {k}: mellan {m[k]:7.2f}"
        for kind in ("reference", "reference-memory"):
            r = results[kind]
            line += f"  {kind} {r[k]:7.2f} (ratio {m[k] / r[k]:.2f})"
        print(line)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", choices=["mellan", "reference", "reference-memory"])
    ap.add_argument("--produce", action="store_true", help="be mellan's stream producer")
    ap.add_argument("--db")
    ap.add_argument("--info", type=Path)
    ns = ap.parse_args()
    if ns.produce:
        mellan_producer(json.loads(ns.info.read_text()))
    elif ns.serve == "mellan":
        serve_mellan(ns.db, ns.info)
    elif ns.serve in ("reference", "reference-memory"):
        serve_reference(ns.db, ns.info, memory=ns.serve == "reference-memory")
    else:
        sys.exit(main())
