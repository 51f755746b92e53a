#!/usr/bin/env python3
"""A throwaway mellan relay + receiver for running the A2A TCK against.

Starts a relay (SQLite in a temp dir, with ``--grpc-port``), creates agent ``sut/agent``
and a caller ``tck/client`` granted capability ``tck``, runs ``mellan receiver run`` with
a ``command`` route whose program answers by the TCK's messageId prefixes, and, since the
TCK sends no credential, a local HTTP proxy that adds the caller's bearer token to every
request and forwards it to the relay. Prints the ``--sut-host`` to give the TCK (the
agent's base URL behind the proxy) and runs until interrupted.

    python scripts/tck_sut.py            # then, in another shell:
    $TCK/.venv/bin/python $TCK/run_tck.py --sut-host URL --transport jsonrpc,http_json

The TCK's gRPC client sends neither a credential nor the request's ``tenant`` (which names
the agent over gRPC), so the card's gRPC address is a second proxy here that adds both
and forwards each call to the relay's own gRPC port.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

AGENT = "sut/agent"
CALLER = "tck/client"
CAPABILITY = "tck"

# The task program: the prompt on stdin, the messageId in MELCHIOR_TURN_MESSAGE_ID.
PROGRAM = r"""#!/usr/bin/env python3
import json, os, sys, time
text = sys.stdin.read()
mid = os.environ.get("MELCHIOR_TURN_MESSAGE_ID", "")
probe = mid + " " + text
with open(os.environ["TCK_SUT_LOG"], "a") as log:
    log.write(repr({k: v for k, v in os.environ.items() if k.startswith("MEL")}) + "\n")
def has(prefix):
    return prefix in probe
def answer(*parts):  # the route says stdout = "parts": A2A parts, as JSON
    print(json.dumps(list(parts))); sys.exit(0)
FILE = {"mediaType": "text/plain", "filename": "output.txt"}
if has("tck-input-required"):
    print("need more input"); sys.exit(3)
if has("tck-reject-task"):
    print("rejected"); sys.exit(4)
if has("test-resubscribe-message-id"):
    time.sleep(6)
if has("tck-artifact-text") or has("tck-stream-artifact-text"):
    answer({"text": "Generated text content"})
if has("tck-artifact-file-url"):
    answer({"url": "https://example.com/output.txt", **FILE})
if has("tck-artifact-file"):
    answer({"raw": "dGNr", **FILE})  # b"tck"
if has("tck-artifact-data"):
    answer({"data": {"key": "value", "count": 42}})
if has("tck-stream-artifact-chunked"):
    time.sleep(0.2); answer({"text": "chunk-1 "}, {"text": "chunk-2"})
if has("tck-message-response"):  # a direct reply: the route's reply_exit
    print("Direct message response"); sys.exit(5)
if has("tck-"):
    answer({"text": "Hello from TCK"})
answer({"text": text})
"""


def _run(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(["mellan", *args], env=env, check=True, capture_output=True, text=True)
    return out.stdout + out.stderr


def _wait_for(path: Path, pattern: str, timeout: float = 30.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, path.read_text() if path.exists() else "")
        if match:
            return match
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {pattern!r} in {path}")


def _proxy(
    relay: str, token: str, port: int, swap: tuple[bytes, bytes] = (b"", b"")
) -> http.server.ThreadingHTTPServer:
    """The HTTP proxy; in whole (not chunked) bodies, ``swap[0]`` becomes ``swap[1]``: the
    card's gRPC address, the relay's own, is the gRPC proxy's."""
    target = urllib.parse.urlsplit(relay)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            headers["Authorization"] = f"Bearer {token}"
            conn = http.client.HTTPConnection(
                target.hostname or "127.0.0.1", target.port, timeout=60
            )
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            self.send_response(resp.status)
            chunked = resp.getheader("Content-Length") is None
            whole = b"" if chunked else resp.read()
            if swap[0]:
                whole = whole.replace(*swap)
            for key, value in resp.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(len(whole)))
            self.end_headers()
            while chunked:
                data = resp.read1(65536)
                if not data:
                    self.wfile.write(b"0\r\n\r\n")
                    break
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(whole)
            conn.close()

        do_GET = do_POST = do_DELETE = do_PUT = _forward

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


_HOP_BY_HOP = ("authorization", "user-agent", "content-type", "te", "grpc-")


def _grpc_proxy(relay_grpc: str, token: str, tenant: str, port: int) -> Any:
    """A gRPC proxy for the TCK's gRPC client, which sends neither a credential nor a
    ``tenant``: every RPC of the A2A service is decoded, given the agent's ``tenant`` when
    it names none, and sent on to the relay with the caller's bearer token; the relay's
    answer (or its status, details and trailing metadata, the A2A error details among
    them) comes back as it was."""
    from concurrent import futures

    import grpc
    from a2a.types import a2a_pb2
    from google.protobuf import message_factory

    service = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"]
    name = service.full_name
    channel = grpc.insecure_channel(relay_grpc)

    def forward(method: Any, request: Any, context: Any) -> tuple[Any, list[tuple[str, str]]]:
        if "tenant" in request.DESCRIPTOR.fields_by_name and not request.tenant:
            request.tenant = tenant
        metadata = [
            (k, v)
            for k, v in context.invocation_metadata()
            if not k.startswith(":") and not k.lower().startswith(_HOP_BY_HOP)
        ]
        metadata.append(("authorization", f"Bearer {token}"))
        reply = message_factory.GetMessageClass(method.output_type)
        stub = (channel.unary_stream if method.server_streaming else channel.unary_unary)(
            f"/{name}/{method.name}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=reply.FromString,
        )
        return stub, metadata

    def fail(context: Any, exc: Any) -> None:
        context.set_trailing_metadata(exc.trailing_metadata() or ())
        context.abort(exc.code(), exc.details() or "")

    def unary(method: Any) -> Any:
        def handle(request: Any, context: Any) -> Any:
            stub, metadata = forward(method, request, context)
            try:
                return stub(request, metadata=metadata, timeout=_deadline(context))
            except grpc.RpcError as exc:
                fail(context, exc)

        return handle

    def streaming(method: Any) -> Any:
        def handle(request: Any, context: Any) -> Any:
            stub, metadata = forward(method, request, context)
            try:
                yield from stub(request, metadata=metadata, timeout=_deadline(context))
            except grpc.RpcError as exc:
                fail(context, exc)

        return handle

    handlers = {}
    for method in service.methods:
        decode = message_factory.GetMessageClass(method.input_type).FromString
        encode = lambda m: m.SerializeToString()  # noqa: E731
        if method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                streaming(method), request_deserializer=decode, response_serializer=encode
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                unary(method), request_deserializer=decode, response_serializer=encode
            )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def _deadline(context: Any) -> float | None:
    """The caller's deadline, passed on; a call without one has no deadline either (grpc
    then reports a remaining time so large that, passed on, it expires at once)."""
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 86400 else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="proxy port (default: free)")
    parser.add_argument(
        "--grpc-port", type=int, default=50151, help="the gRPC port the card names (a proxy)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir at the end")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tck-sut-"))
    env = dict(
        os.environ,
        HOME=str(work),
        XDG_DATA_HOME=str(work / "data"),
        XDG_CONFIG_HOME=str(work / "config"),
        TCK_SUT_LOG=str(work / "program.log"),
    )
    env.pop("MELLAN_TOKEN", None)
    proxy_probe = http.server.ThreadingHTTPServer(
        ("127.0.0.1", args.port), http.server.BaseHTTPRequestHandler
    )
    proxy_port = proxy_probe.server_address[1]
    proxy_probe.server_close()
    public = f"http://127.0.0.1:{proxy_port}"
    relay_grpc = _free_port()  # the relay's own; the card names the proxy's, args.grpc_port
    procs: list[subprocess.Popen[bytes]] = []
    servers: list[Any] = []  # the gRPC proxy (stopped if it were let go)
    relay_log = work / "relay.log"
    with relay_log.open("wb") as out:
        procs.append(
            subprocess.Popen(
                [
                    "mellan",
                    "relay",
                    "--port",
                    "0",
                    "--grpc-port",
                    str(relay_grpc),
                    "--public-url",
                    public,
                ],
                cwd=work,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        relay = _wait_for(relay_log, r"listening on (http\S+)").group(1)
        _run(env, "login", "--relay", relay, "--token-file", str(work / "data/mellan/owner.token"))
        _run(env, "agent", "add", AGENT, "--capability", f"{CAPABILITY}=TCK behaviours")
        _run(env, "agent", "add", CALLER)
        _run(env, "grant", "add", CALLER, AGENT, CAPABILITY)
        for agent in (AGENT, CALLER):
            code = _run(env, "enroll", agent).splitlines()[0]
            _run(env, "join", code, "--relay", relay)
        program = work / "sut_program.py"
        program.write_text(PROGRAM)
        program.chmod(0o755)
        route = _run(
            env,
            "connect",
            "command",
            "--as",
            AGENT,
            "--capability",
            CAPABILITY,
            "--cwd",
            str(work),
            "--option",
            "reply_exit=5",
            "--option",
            "stdout=parts",
            "--",
            str(program),
        )
        route_id = re.search(r"\brt_\w+", route)
        if route_id:
            _run(env, "route", "approve", route_id.group(0))
        (work / "receiver.toml").write_text(
            f'agent = "{AGENT}"\nconcurrency = 8\n\n[allow]\nadapters = ["command"]\n'
            f'cwd = ["{work}"]\nprograms = ["{program}"]\n'
        )
        with (work / "receiver.log").open("wb") as out:
            procs.append(
                subprocess.Popen(
                    ["mellan", "receiver", "run", "--config", str(work / "receiver.toml")],
                    cwd=work,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        _wait_for(work / "receiver.log", r"receiver for")
        cred = json.loads(next((work / "config").rglob("tck/client.json")).read_text())
        token = cred.get("token") or cred["credential"]
        swap = (f"127.0.0.1:{relay_grpc}".encode(), f"127.0.0.1:{args.grpc_port}".encode())
        _proxy(relay, token, proxy_port, swap)
        servers.append(_grpc_proxy(f"127.0.0.1:{relay_grpc}", token, f"default/{AGENT}",
                                   args.grpc_port))  # fmt: skip
        print(f"sut-host {public}/a2a/default/{AGENT}", flush=True)
        print(f"work dir {work}", flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(1)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for server in servers:
            server.stop(0)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
