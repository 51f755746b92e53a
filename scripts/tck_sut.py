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

gRPC is served by the relay on the card's gRPC interface, but the proxy is HTTP/1.1
only, so gRPC calls reach the relay without a credential.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

AGENT = "sut/agent"
CALLER = "tck/client"
CAPABILITY = "tck"

# The task program: the prompt on stdin, the messageId in MELCHIOR_TURN_MESSAGE_ID.
PROGRAM = r"""#!/usr/bin/env python3
import os, sys, time
text = sys.stdin.read()
mid = os.environ.get("MELCHIOR_TURN_MESSAGE_ID", "")
probe = mid + " " + text
with open(os.environ["TCK_SUT_LOG"], "a") as log:
    log.write(repr({k: v for k, v in os.environ.items() if k.startswith("MEL")}) + "\n")
def has(prefix):
    return prefix in probe
if has("tck-input-required"):
    print("need more input"); sys.exit(3)
if has("tck-reject-task"):
    print("rejected"); sys.exit(4)
if has("test-resubscribe-message-id"):
    time.sleep(6)
if has("tck-artifact-text") or has("tck-stream-artifact-text"):
    print("Generated text content"); sys.exit(0)
if has("tck-stream-artifact-chunked"):
    print("chunk-1 ", flush=True); time.sleep(0.2); print("chunk-2"); sys.exit(0)
if has("tck-message-response"):  # a direct reply: the route's reply_exit
    print("Direct message response"); sys.exit(5)
if has("tck-"):
    print("Hello from TCK"); sys.exit(0)
print(text)
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


def _proxy(relay: str, token: str, port: int) -> http.server.ThreadingHTTPServer:
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
            for key, value in resp.getheaders():
                if key.lower() not in ("transfer-encoding", "connection"):
                    self.send_header(key, value)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                data = resp.read1(65536) if chunked else resp.read()
                if not data:
                    break
                if chunked:
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                else:
                    self.wfile.write(data)
                    break
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
            conn.close()

        do_GET = do_POST = do_DELETE = do_PUT = _forward

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="proxy port (default: free)")
    parser.add_argument("--grpc-port", type=int, default=50151, help="relay gRPC port")
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
    procs: list[subprocess.Popen[bytes]] = []
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
                    str(args.grpc_port),
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
        _proxy(relay, token, proxy_port)
        print(f"sut-host {public}/a2a/default/{AGENT}", flush=True)
        print(f"work dir {work}", flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(1)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
