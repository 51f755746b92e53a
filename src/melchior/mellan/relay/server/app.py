"""The relay's ASGI application: control API, receiver API and the A2A entry, one app.

Any replica serves any request: all state is in the store, and ``request.app.state.relay``
holds the shared :class:`~melchior.mellan.relay.context.Relay`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from melchior.mellan.relay.auth import bearer, hash_token, identify, same_hash
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.metrics import CONTENT_TYPE
from melchior.mellan.relay.observe import Observe
from melchior.mellan.relay.store.base import CredentialKind

if TYPE_CHECKING:
    from melchior.mellan.relay.surfaces.dashboard import Settings

log = logging.getLogger("melchior.mellan")

MAX_HEADER_BYTES = 64 * 1024
"""Largest request head (request line and headers) accepted; past it, 431."""


class HeaderLimit:
    """Answer ``431`` to a request whose headers, taken together, pass ``limit`` bytes.

    The HTTP parser only bounds a head that is still arriving; one that arrives whole in a
    few reads is parsed at any size, so the total is measured here too, before any route
    (or authentication) spends work on it."""

    def __init__(self, app: ASGIApp, limit: int = MAX_HEADER_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
            size += sum(len(k) + len(v) + 4 for k, v in scope["headers"])
            if size > self.limit:
                text = f"request headers are larger than this relay accepts ({self.limit} bytes)"
                response = PlainTextResponse(text, 431)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def healthz(request: Request) -> JSONResponse:
    relay: Relay = request.app.state.relay
    try:
        now = await relay.call(relay.store.now)
    except Exception as exc:  # the database is the relay's heart; say so plainly
        return JSONResponse({"ok": False, "error": f"database unavailable: {exc}"}, 503)
    return JSONResponse({"ok": True, "now": now})


async def readyz(request: Request) -> JSONResponse:
    """Ready to serve: the database answers and its schema is the one this code writes.
    503 with the reason otherwise (a balancer takes the replica out; ``/healthz`` stays
    the cheap liveness check)."""
    relay: Relay = request.app.state.relay
    try:
        version = await relay.call(relay.store.schema_version)
        now = await relay.call(relay.store.now)
    except Exception as exc:
        reason = f"database unavailable: {exc}"
        return JSONResponse({"ready": False, "reason": reason}, 503)
    latest = relay.store.latest_schema
    body = {"ready": version == latest, "schema": version, "schema_expected": latest, "now": now}
    if version < latest:
        body["reason"] = (
            f"the database schema is at version {version}, this relay needs {latest}; "
            "restart a replica of this version to upgrade it"
        )
    elif version > latest:
        body["reason"] = (
            f"the database schema is at version {version}, newer than this relay's {latest}; "
            "upgrade this replica"
        )
    return JSONResponse(body, 200 if version == latest else 503)


async def metrics(request: Request) -> Response:
    """Prometheus text (:mod:`.metrics`) for an owner credential or the relay's metrics
    token (compared in constant time); gauges read in a worker thread, cached."""
    relay: Relay = request.app.state.relay
    token = bearer(request.headers.get("authorization"))
    allowed = False
    if token is not None and relay.metrics_token is not None:
        allowed = same_hash(hash_token(token), hash_token(relay.metrics_token))
    if not allowed:
        principal, _why = await identify(request, relay)
        if principal is None:
            text = "send 'Authorization: Bearer <owner token or metrics token>'"
            headers = {"WWW-Authenticate": "Bearer"}
            return PlainTextResponse(f"metrics need a credential: {text}", 401, headers=headers)
        if principal.kind is not CredentialKind.OWNER:
            return PlainTextResponse("metrics need an owner credential or the metrics token", 403)
    gauges = await relay.call(relay.metrics.gauges, relay.store)
    return Response(relay.metrics.render(gauges), media_type=CONTENT_TYPE)


async def sweep_leases(relay: Relay) -> None:
    """Fail expired leases that have no attempts left, every ``relay.sweep_interval``.

    Runs on every replica: the store's sweep is a single conditional statement, so two
    replicas sweeping at once do no double work. Reclaiming expired leases with attempts
    left needs no sweeper (claim does it); this only makes spent tasks visibly *failed*
    even when no receiver comes back. A database outage is logged and retried.
    """
    while True:
        await asyncio.sleep(relay.sweep_interval)
        try:
            changed = await relay.call(relay.store.sweep)
        except Exception as exc:
            log.warning("lease sweep failed (will retry): %s", exc)
            continue
        if changed:
            log.info("lease sweep: %d expired task(s) out of attempts marked failed", changed)


def create_app(relay: Relay, *, dashboard: Settings | None = None) -> Starlette:
    """The replica's application: ``/healthz``, and three mounts that each render their
    own refusals — ``/api`` (control and receiver APIs: ``{"error": {code, reason,
    rule}}``), ``/a2a`` (JSON-RPC or ``google.rpc.Status``, by binding) and ``/ui`` (the
    owner's dashboard; ``/`` leads there) — so no endpoint catches errors itself. The
    lifespan owns every background task of the replica (lease sweeper, accept batcher,
    push deliverer, retention, waker) in one task group, and awaits them on the way out."""
    from melchior.mellan.relay.refusals import HANDLERS
    from melchior.mellan.relay.surfaces import a2a, control, receiver, route_changes, wakeconfig
    from melchior.mellan.relay.surfaces.a2a import paths
    from melchior.mellan.relay.surfaces.dashboard import PREFIX, create_dashboard

    api = Starlette(
        routes=control.routes()
        + receiver.routes()
        + route_changes.http_routes()
        + wakeconfig.http_routes(),
        exception_handlers=HANDLERS,
    )
    entry = Starlette(routes=a2a.routes(), exception_handlers=a2a.HANDLERS)
    for sub in (api, entry):
        sub.state.relay = relay

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        from melchior.mellan.relay.workers.push import Pusher
        from melchior.mellan.relay.workers.retention import keep_tasks_for
        from melchior.mellan.relay.workers.wake import Waker

        await relay.notifier.start()
        try:
            async with asyncio.TaskGroup() as tasks:
                relay.pusher = relay.pusher or Pusher(relay)
                relay.waker = relay.waker or Waker(relay)
                relay.watches.start(tasks)
                owned = [
                    tasks.create_task(sweep_leases(relay), name="mellan-lease-sweeper"),
                    relay.batcher.start(tasks),
                    relay.pusher.start(tasks),
                    relay.waker.start(tasks),
                ]
                if relay.grpc is not None:
                    from melchior.mellan.relay.surfaces.a2a import grpc_binding

                    server = await grpc_binding.start(relay, relay.grpc)
                    owned.append(tasks.create_task(grpc_binding.run(server), name="mellan-grpc"))
                if relay.retain_days:
                    job = keep_tasks_for(relay, relay.retain_days,
                                         interval=relay.retention_interval,
                                         first=relay.retention_first)  # fmt: skip
                    owned.append(tasks.create_task(job, name="mellan-retention"))
                try:
                    yield
                finally:
                    for task in owned:
                        task.cancel()
                    relay.watches.stop()
        finally:
            await relay.notifier.stop()

    app = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/", lambda _: RedirectResponse(PREFIX + "/", 307)),
            Mount("/api", api),
            Mount(paths.PREFIX, entry),
            Mount(PREFIX, create_dashboard(relay, dashboard)),
        ],
        lifespan=lifespan,
        middleware=[Middleware(Observe, metrics=relay.metrics), Middleware(HeaderLimit)],
    )
    app.state.relay = relay
    return app
