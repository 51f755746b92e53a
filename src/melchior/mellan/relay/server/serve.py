"""Running one relay replica: open the store, bootstrap the workspace, serve HTTP with uvicorn.

First start of an empty database creates workspace ``default`` and one owner credential.
The token is written once to a private (0600) file whose *path* is printed; the token
itself is never printed, so it does not end up in terminal scrollback or service logs.
Later starts (and other replicas on the same PostgreSQL) find the workspace and mint
nothing. ``--mint-owner-token`` mints an additional owner credential on purpose (e.g.
the first file was lost); revoke old ones with ``mellan credential revoke``.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import os
import shlex
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from melchior import __version__
from melchior.files import write_private, xdg
from melchior.mellan.relay.auth import hash_token, new_token
from melchior.mellan.relay.caches.limits import SendLimits
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.metrics import Metrics
from melchior.mellan.relay.notify import LocalNotifier, Notifier
from melchior.mellan.relay.observe import configure_logging
from melchior.mellan.relay.server import gcpolicy
from melchior.mellan.relay.server.app import MAX_HEADER_BYTES, create_app
from melchior.mellan.relay.server.tls import ClientCertGate, ServerTls, TlsError, peer_tls
from melchior.mellan.relay.store import is_postgres, open_store
from melchior.mellan.relay.store.base import CredentialKind, Record, Store
from melchior.mellan.relay.store.dburl import redact
from melchior.policy.outbound import loopback
from melchior.policy.send_limits import DEFAULTS, Limits

if TYPE_CHECKING:
    from melchior.mellan.relay.surfaces.a2a.grpc_binding import GrpcEndpoint

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
WORKSPACE = "default"
OWNER = "owner"


@dataclass(frozen=True)
class RelayOptions:
    database: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    grpc_port: int | None = None
    public_url: str | None = None
    owner_token_file: Path | None = None
    mint_owner_token: bool = False
    max_body: int = 16 * 1024 * 1024
    max_result: int = 8 * 1024 * 1024
    body_deadline: float = 30.0
    json: bool = False
    retain_days: float | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    insecure_http: bool = False
    log_format: str = "text"
    metrics_token_file: Path | None = None
    metrics_cache_seconds: float = 10.0
    gc_threshold: int = gcpolicy.YOUNG
    limits: Limits = DEFAULTS


def data_dir() -> Path:
    return xdg("data") / "mellan"


def bootstrap(
    store: Store, token_file: Path, url: str, *, force: bool, say: Callable[..., None]
) -> bool:
    """Create workspace ``default`` and an owner credential on an empty database.

    The token file is written *before* the credential is stored, so a crash can leave an
    unused file but never a stored owner credential nobody holds. Returns True when a
    credential was minted.
    """
    created = store.ensure_workspace(WORKSPACE)
    if not created and not force:
        say(f"workspace {WORKSPACE!r} exists; owner credentials were issued before")
        return False
    token = new_token()
    write_private(token_file, token + "\n")
    audit = Record(
        "relay", "credential.add", "bootstrap",
        "owner credential minted at relay start" + (" (first start)" if created else ""),
    )  # fmt: skip
    credential_id = store.add_credential(
        WORKSPACE, CredentialKind.OWNER, OWNER, hash_token(token), record=audit
    )
    prefix = f"created workspace {WORKSPACE!r}; " if created else ""
    say(
        f"{prefix}owner credential {credential_id} written to {token_file} "
        "(mode 0600; the token is not shown again)",
        "owner-credential",
        credential_id=credential_id,
        token_file=str(token_file),
    )
    say(f"  log in with: {mellan_command()} login --relay {url} --token-file {token_file}")
    return True


def mellan_command() -> str:
    """How the person reading this runs this same ``mellan``: the bare name when their
    PATH finds this one, else its path (a fresh checkout's lives in ``.venv/bin``)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) != "mellan":
        return "mellan"
    mine = os.path.realpath(argv0)
    found = shutil.which("mellan")
    if found is not None and os.path.realpath(found) == mine:
        return "mellan"
    return shlex.quote(os.path.abspath(argv0))


def make_notifier(database: str | None) -> Notifier:
    """LISTEN/NOTIFY between replicas on PostgreSQL; an in-process hub on SQLite."""
    if is_postgres(database):
        assert database is not None
        from melchior.mellan.relay.server.pgnotify import PgNotifier

        notifier: Notifier = PgNotifier(database)
        return notifier
    return LocalNotifier()


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP, and accepted sockets inherit it; with 0, a keep-alive response waited out the
    # client's delayed ACK (~40 ms) between its head and its body
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class HeaderLimitedH11(H11Protocol):
    """uvicorn's h11 protocol, except that a request head still growing past
    :data:`MAX_HEADER_BYTES` is answered ``431 Request Header Fields Too Large`` with the
    reason (as h11 itself hints) instead of a bare "400 Invalid HTTP request". (A head that
    arrives whole is measured by the app, :class:`~melchior.mellan.relay.server.app.HeaderLimit`.) A
    client still sending a huge head may see the connection reset before it reads the
    answer; that much the server cannot help."""

    def send_400_response(self, msg: str) -> None:
        pending, _closed = self.conn.trailing_data
        if self.conn.their_state is not h11.ERROR or len(pending) <= MAX_HEADER_BYTES:
            super().send_400_response(msg)
            return
        text = f"request headers are larger than this relay accepts ({MAX_HEADER_BYTES} bytes)"
        head = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        for event in (
            h11.Response(status_code=431, headers=head, reason=b"Request Header Fields Too Large"),
            h11.Data(data=text.encode("ascii")),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """On an HTTPS connection, put the verified client certificate (if any) in every
        request's scope as the ASGI TLS extension, for :class:`~.tls.ClientCertGate`."""
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None:
            return
        tls = peer_tls(ssl_object)
        inner = self.app

        async def app(scope: Any, receive: Any, send: Any) -> None:
            scope.setdefault("extensions", {})["tls"] = tls
            await inner(scope, receive, send)

        self.app = app


def _dump_tasks(sig: int, frame: FrameType | None) -> None:
    """SIGUSR2: the event loop's tasks and where each waits, to stderr (a thread's stack
    shows only that the loop is idle; a shutdown that does not end waits in a task)."""
    try:
        tasks = asyncio.all_tasks(asyncio.get_running_loop())
    except RuntimeError:
        return
    for task in tasks:
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


class _Server(uvicorn.Server):
    """uvicorn, but SIGINT/SIGTERM mean "drain and exit 0" rather than re-raising the signal
    after shutdown (which would skip closing the store and report a kill to systemd), and
    open long-polls are told to answer now rather than hold the drain open."""

    def __init__(
        self, config: uvicorn.Config, relay: Relay, on_hup: Callable[[], None] | None = None
    ) -> None:
        super().__init__(config)
        self.relay = relay
        self.on_hup = on_hup

    def handle_hup(self, sig: int, frame: FrameType | None) -> None:
        """SIGHUP: reload the certificate on the event loop's own turn (never inside
        whatever the signal interrupted, which may be a print or a handshake)."""
        if self.on_hup is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.on_hup()
            return
        loop.call_soon_threadsafe(self.on_hup)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.relay.closing = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        if self.on_hup is not None:
            previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self.handle_hup)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def transport_policy(options: RelayOptions) -> tuple[str | None, str | None]:
    """(refusal, warning) for where and how the relay is asked to listen.

    Rule: a bearer token crossing the network in clear is a stolen credential, so a
    non-loopback address serves HTTPS, unless the operator says ``--insecure-http`` (e.g.
    a TLS-terminating proxy on another host of a private network) and is warned."""
    if (options.tls_cert is None) != (options.tls_key is None):
        return "--tls-cert and --tls-key go together (tls.cert and tls.key)", None
    if options.client_ca is not None and options.tls_cert is None:
        return "--client-ca (tls.client_ca) needs HTTPS: give --tls-cert and --tls-key", None
    if options.tls_cert is not None or loopback(options.host):
        return None, None
    if not options.insecure_http:
        return (
            f"refusing to serve plain HTTP on {options.host}, which other machines can reach: "
            "credentials and task payloads would cross the network unencrypted. Give "
            "--tls-cert/--tls-key, bind 127.0.0.1 behind a TLS proxy, or pass "
            "--insecure-http to accept the risk"
        ), None
    return None, (
        f"warning: --insecure-http: serving plain HTTP on {options.host}; anyone on the path "
        "can read and replay bearer tokens and task payloads"
    )


def grpc_endpoint(
    options: RelayOptions, public: str, say: Callable[..., None]
) -> GrpcEndpoint | None:
    """Where the A2A gRPC binding listens: ``--host`` and ``--grpc-port``, with the HTTPS
    certificate when there is one (no client CA: client certificates bind only the
    receiver API, which is HTTP); the card names the public URL's host. It is bound in
    the app's lifespan, which says so (port 0 is the port bound)."""
    if options.grpc_port is None:
        return None
    from melchior.mellan.relay.surfaces.a2a.grpc_binding import GrpcEndpoint

    def listening(target: str) -> None:
        scheme = "TLS" if options.tls_cert is not None else "plaintext"
        say(f"A2A over gRPC ({scheme}) on {target}", "grpc-listening", target=target)

    return GrpcEndpoint(
        options.host,
        options.grpc_port,
        tls_cert=options.tls_cert,
        tls_key=options.tls_key,
        public_host=urlsplit(public).hostname,
        on_listening=listening,
    )


def serve(options: RelayOptions, out: TextIO = sys.stdout) -> int:
    """Run one replica until SIGINT/SIGTERM; return an exit status."""

    def say(line: str, event: str = "status", **fields: object) -> None:
        if options.json:
            print(json.dumps({"event": event, "message": line, **fields}), file=out, flush=True)
        else:  # what stops the relay goes where errors go; the JSON log is one stream
            where = sys.stderr if event == "error" and out is sys.stdout else out
            print(f"mellan relay: {line}", file=where, flush=True)

    configure_logging(options.log_format, access=options.log_format == "json")
    metrics_token = None
    if options.metrics_token_file is not None:
        try:
            metrics_token = options.metrics_token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            say(f"cannot read the metrics token file {options.metrics_token_file}: {exc}", "error")
            return 2
        if len(metrics_token) < 16:
            say("the metrics token must be at least 16 characters", "error")
            return 2
    say(f"version {__version__}", "version", version=__version__)
    refusal, warning = transport_policy(options)
    if refusal:
        say(refusal, "error")
        return 2
    tls: ServerTls | None = None
    if options.tls_cert is not None and options.tls_key is not None:
        tls = ServerTls(options.tls_cert, options.tls_key, options.client_ca)
        try:
            tls.build()
        except TlsError as exc:
            say(f"cannot serve HTTPS: {exc}", "error")
            return 1
    say(f"database {redact(options.database)}", "database", database=redact(options.database))
    try:
        sock = bind(options.host, options.port)
    except OSError as exc:
        say(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc} (is "
            "another relay running? choose another port with --port or $MELLAN_PORT)",
            "error",
        )
        return 1
    if options.grpc_port:  # said now and plainly, not as a failed start-up later
        try:
            bind(options.host, options.grpc_port).close()
        except OSError as exc:
            sock.close()
            say(
                f"cannot listen for gRPC on {options.host}:{options.grpc_port}: "
                f"{exc.strerror or exc} (choose another with --grpc-port or $MELLAN_GRPC_PORT)",
                "error",
            )
            return 1
    notifier = make_notifier(options.database)
    try:
        store = open_store(options.database, publish=notifier.publish, migrate=False)
        try:  # migrate here rather than in open_store, to say what it changed
            before: int | None = getattr(store, "schema_version", lambda: None)()
            after = store.migrate()
        except BaseException:
            store.close()
            raise
    except Exception as exc:
        sock.close()
        say(f"cannot open the database: {exc}", "error")
        if is_postgres(options.database):
            say(
                "  check the URL, that PostgreSQL is running, and that the role may connect",
                "error",
            )
        return 1
    try:
        if before == after or before is None:  # an operator upgrading wants to see it said
            say(f"schema up to date (version {after})")
        elif before == 0:
            say(f"schema created (version {after})")
        else:
            say(f"schema upgraded from version {before} to {after}")
        port = sock.getsockname()[1]
        host = options.host if ":" not in options.host else f"[{options.host}]"
        url = f"{'https' if tls else 'http'}://{host}:{port}"
        public = (options.public_url or url).rstrip("/")
        token_file = options.owner_token_file or data_dir() / "owner.token"
        bootstrap(store, token_file, public, force=options.mint_owner_token, say=say)
        relay = Relay(
            store=store,
            notifier=notifier,
            public_url=public,
            max_body=options.max_body,
            max_result=options.max_result,
            body_deadline=options.body_deadline,
            limits=SendLimits(options.limits),
            metrics=Metrics(cache_seconds=options.metrics_cache_seconds),
            metrics_token=metrics_token,
            retain_days=options.retain_days,
            grpc=grpc_endpoint(options, public, say),
        )
        if options.retain_days:
            say(f"finished tasks are deleted {options.retain_days:g} day(s) after they finish")
        app: Any = create_app(relay)
        if tls is not None and tls.client_ca is not None:
            app = ClientCertGate(app)
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=None,  # uvicorn's own lines go through our handler (JSON or text)
            lifespan="on",
            timeout_graceful_shutdown=5,
            proxy_headers=False,
            http=HeaderLimitedH11,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        )
        config.load()
        if tls is not None:
            config.ssl = tls.context  # the live context: SIGHUP reloads into it

        def reload_tls() -> None:
            if tls is None:  # SIGHUP must not kill a relay a unit's ExecReload signals
                say("SIGHUP: nothing to reload (no --tls-cert)")
                return
            message = tls.reload()
            failed = message.startswith("certificate reload failed")
            if not failed and relay.grpc is not None:
                relay.grpc.reload_tls()  # new gRPC connections read the pair again
            say(message, "tls-reload-failed" if failed else "tls-reloaded")

        server = _Server(config, relay, on_hup=reload_tls)
        if threading.current_thread() is threading.main_thread():
            # From here on a signal means "stop gracefully", even before uvicorn installs
            # its own handlers: a supervisor may stop us right after "ready".
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, server.handle_exit)
            signal.signal(signal.SIGHUP, server.handle_hup)
            # SIGUSR1: every thread's stack to stderr, for a relay that seems stuck (a
            # shutdown that does not end, a request that never answers); it keeps running
            faulthandler.register(signal.SIGUSR1, all_threads=True)
            signal.signal(signal.SIGUSR2, _dump_tasks)
        say(
            f"listening on {url}" + (f" (public URL {public})" if public != url else ""),
            "listening",
            url=url,
            public_url=public,
        )
        say(
            f"dashboard: {public}/ui/ (a one-time sign-in link: {mellan_command()} dashboard "
            "link, once logged in)",
            "dashboard",
            url=f"{public}/ui/",
        )
        if tls is not None:
            mtls = f"; client certificates from {tls.client_ca} required on /api/receiver/"
            say(f"HTTPS with {tls.cert}" + (mtls if tls.client_ca else "") + "; SIGHUP reloads")
        if warning:
            say(warning, "warning")
        # start-up is done: what it made is frozen, the young threshold raised (gcpolicy)
        with gcpolicy.applied(options.gc_threshold, relay.metrics.gc_pauses.callback) as n:
            say(
                f"garbage collection: {n} start-up objects frozen, a young pass every "
                f"{options.gc_threshold} allocations",
                "gc",
                frozen=n,
                threshold=options.gc_threshold,
            )
            say("ready; Ctrl-C or SIGTERM stops it gracefully", "ready")
            server.run(sockets=[sock])
        if not server.started:  # the lifespan failed (its error is logged above)
            say("could not start; stopped", "error")
            return 1
        say("stopped", "stopped")
        return 0
    finally:
        sock.close()
        store.close()
