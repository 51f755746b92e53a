"""SendMessage accepted/s and stream event latency over gRPC beside JSON-RPC, one relay.

One relay (its own process: the production app under uvicorn, with the gRPC binding of
``--grpc-port`` in its lifespan), on a fresh database of each engine in turn
(``BENCH_ENGINES=sqlite,postgres``; PostgreSQL at ``$MELCHIOR_TEST_PG``). The same send —
``SendMessage`` with ``returnImmediately``, authenticated, grant-checked, audited and
stored as a queued task, no receiver running — is sent ``BENCH_SENDS`` times by
``BENCH_CONCURRENCY`` clients over each binding, the two bindings alternating for
``BENCH_ROUNDS`` rounds so a neighbour's load falls on both. Printed per binding: the
median accepted/s and the relay's CPU milliseconds per accepted request (from
``/proc``: on a shared machine the rate moves with the neighbours, the CPU much less).

The JSON-RPC client is ``a2a_send.Connection`` (prebuilt HTTP/1.1 requests); the gRPC
client is ``grpc.aio`` with the generated stub, one channel per client.

Stream latency (measured first, while nothing else is queued): ``BENCH_STREAMS``
``SendStreamingMessage`` calls per binding, one at a time; a receiver in a process of
its own (``a2a_send.mellan_producer``) reports ``BENCH_EVENTS`` status updates per task
stamped with ``time.time_ns()``; the milliseconds to their arrival (SSE, or the gRPC
stream) are the latency (p50, p95).

Run ``.venv/bin/python bench/a2a_grpc.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from a2a.types import a2a_pb2, a2a_pb2_grpc

from a2a_send import (
    CONCURRENCY,
    EVENTS,
    RECEIVER,
    SENDS,
    STREAMS,
    WS,
    Connection,
    cpu_seconds,
    databases,
    mellan_producer,
    pct,
    rpc,
    seed_bench_store,
    stream_latencies,
)

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve(db: str, info: Path) -> None:
    import uvicorn

    from melchior.mellan.relay.caches.limits import SendLimits
    from melchior.mellan.relay.context import Relay
    from melchior.mellan.relay.notify import LocalNotifier
    from melchior.mellan.relay.server.app import create_app
    from melchior.mellan.relay.server.serve import MAX_HEADER_BYTES, HeaderLimitedH11, bind
    from melchior.mellan.relay.store import open_store
    from melchior.mellan.relay.surfaces.a2a.grpc_binding import GrpcEndpoint
    from melchior.policy.send_limits import Limits

    notifier = LocalNotifier()
    store = open_store(db, publish=notifier.publish)
    tokens = seed_bench_store(store)
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    endpoint = GrpcEndpoint("127.0.0.1", free_port())
    # the send limits are checked (their cost is measured) but set past the bench's load
    limits = SendLimits(Limits(1e6, 10**7, 10**7, 10**7))
    relay = Relay(store=store, notifier=notifier, public_url=url, limits=limits, grpc=endpoint)
    info.write_text(
        json.dumps(
            {"url": url, "rpc": f"{url}/a2a/{WS}/{RECEIVER}", **tokens,
             "grpc": endpoint.target, "pid": os.getpid()}
        )
    )  # fmt: skip
    config = uvicorn.Config(
        create_app(relay),
        log_level="warning",
        http=HeaderLimitedH11,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        loop="asyncio",
    )
    uvicorn.Server(config).run(sockets=[sock])


def grpc_send(text: str = "work") -> a2a_pb2.SendMessageRequest:
    return a2a_pb2.SendMessageRequest(
        tenant=f"{WS}/{RECEIVER}",
        message=a2a_pb2.Message(
            role=a2a_pb2.ROLE_USER, message_id=uuid.uuid4().hex, parts=[a2a_pb2.Part(text=text)]
        ),
        configuration=a2a_pb2.SendMessageConfiguration(return_immediately=True),
    )


async def grpc_stream_latencies(info: dict[str, Any]) -> list[float]:
    """``a2a_send.stream_latencies`` over gRPC: ms from the receiver's stamp to arrival."""
    meta = (("authorization", f"Bearer {info['caller']}"), ("a2a-version", "1.0"))
    out: list[float] = []
    async with grpc.aio.insecure_channel(info["grpc"]) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        for _ in range(STREAMS):
            async for ev in stub.SendStreamingMessage(grpc_send("stream"), metadata=meta):
                arrived = time.time_ns()
                if ev.WhichOneof("payload") != "status_update":
                    continue
                parts = ev.status_update.status.message.parts
                if parts and parts[0].text.isdigit():
                    out.append((arrived - int(parts[0].text)) / 1e6)
    return out


async def over_grpc(info: dict[str, Any], pid: int) -> tuple[float, float]:
    meta = (("authorization", f"Bearer {info['caller']}"), ("a2a-version", "1.0"))
    channels = [grpc.aio.insecure_channel(info["grpc"]) for _ in range(CONCURRENCY)]
    stubs = [a2a_pb2_grpc.A2AServiceStub(c) for c in channels]
    try:
        for stub in stubs:  # warm-up: every channel once
            await stub.SendMessage(grpc_send(), metadata=meta)
        remaining = SENDS

        async def worker(stub: a2a_pb2_grpc.A2AServiceStub) -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                answer = await stub.SendMessage(grpc_send(), metadata=meta)
                if not answer.task.id:
                    raise SystemExit(f"send failed: {answer}")

        c0, t0 = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(worker(s) for s in stubs))
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pid) - c0
        return SENDS / elapsed, cpu * 1000 / SENDS
    finally:
        for c in channels:
            await c.close()


async def over_jsonrpc(info: dict[str, Any], pid: int) -> tuple[float, float]:
    conns = [Connection(info["rpc"], info["caller"]) for _ in range(CONCURRENCY)]
    for c in conns:
        await c.open()
    try:
        for c in conns:
            await c.post(rpc("SendMessage", "warm", {"returnImmediately": True}))
        remaining = SENDS

        async def worker(c: Connection) -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await c.post(rpc("SendMessage", "work", {"returnImmediately": True}))

        c0, t0 = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pid) - c0
        return SENDS / elapsed, cpu * 1000 / SENDS
    finally:
        for c in conns:
            await c.close()


def run_engine(engine: str) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as d, databases(engine, Path(d)) as dbs:
        tmp = Path(d)
        proc, info = start_grpc(dbs["mellan"], tmp)
        try:
            pid = int(info["pid"])
            # stream latency first, while nothing else is queued for the producer
            producer = subprocess.Popen(
                [sys.executable, __file__, "--produce", "--info", str(tmp / "mellan.json")]
            )
            try:
                lat = {
                    "JSON-RPC": asyncio.run(stream_latencies(info)),
                    "gRPC": asyncio.run(grpc_stream_latencies(info)),
                }
            finally:
                producer.terminate()
                producer.wait()
            runs: dict[str, list[tuple[float, float]]] = {"JSON-RPC": [], "gRPC": []}
            for _ in range(ROUNDS):
                runs["JSON-RPC"].append(asyncio.run(over_jsonrpc(info, pid)))
                runs["gRPC"].append(asyncio.run(over_grpc(info, pid)))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    out: dict[str, dict[str, float]] = {}
    for k, v in runs.items():
        if len(lat[k]) < STREAMS * EVENTS * 0.9:
            raise SystemExit(f"{k}: only {len(lat[k])} of {STREAMS * EVENTS} events measured")
        out[k] = {
            "rate": statistics.median(r for r, _ in v),
            "cpu": statistics.median(c for _, c in v),
            "p50": pct(lat[k], 50),
            "p95": pct(lat[k], 95),
        }
    return out


def start_grpc(db: str, tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """This script's ``--serve`` in a process of its own, waited for (HTTP and gRPC)."""
    info = tmp / "mellan.json"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--db", db, "--info", str(info)])
    deadline = time.monotonic() + 60  # a broken start, not a measured threshold
    while not info.exists() or not info.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the relay did not start")
        time.sleep(0.05)
    data: dict[str, Any] = json.loads(info.read_text())
    channel = grpc.insecure_channel(data["grpc"])
    grpc.channel_ready_future(channel).result(timeout=60)
    channel.close()
    return proc, data


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--produce", action="store_true")
    parser.add_argument("--db")
    parser.add_argument("--info")
    args = parser.parse_args()
    if args.serve:
        serve(args.db, Path(args.info))
        return 0
    if args.produce:
        mellan_producer(json.loads(Path(args.info).read_text()))
        return 0
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"# {SENDS} sends x {ROUNDS} rounds, {CONCURRENCY} clients; load {' '.join(load)}")
    for engine in os.environ.get("BENCH_ENGINES", "sqlite,postgres").split(","):
        try:
            results = run_engine(engine)
        except Exception as exc:  # e.g. PostgreSQL not running: say so, measure the rest
            print(f"[{engine}] skipped: {exc}")
            continue
        for binding, r in results.items():
            print(f"[{engine}] {binding:8} SendMessage accepted/s {r['rate']:6.0f}   "
                  f"relay CPU {r['cpu']:5.2f} ms/req   "
                  f"stream event p50 {r['p50']:5.1f} ms, p95 {r['p95']:5.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
