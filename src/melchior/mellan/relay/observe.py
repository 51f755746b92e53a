"""Watching a replica: request ids, access log lines, latency, and the log format.

:class:`Observe` is the app's outermost middleware. Per HTTP request it takes a sane
incoming ``X-Request-Id`` or makes one (:mod:`.requestid`), makes it the request's
context (so log lines and audit records carry it), returns it in the response's
``X-Request-Id``, and when the answer starts, records its latency under the *route
template* that served it (never the raw path: bounded label cardinality) and writes
one access line to the ``melchior.mellan.access`` logger.

:func:`configure_logging` installs ``--log-format json`` (one JSON object per line:
``ts``, ``level``, ``logger``, ``message``, ``request_id`` and any fields the line was
logged with) or ``text``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from melchior.mellan.relay import requestid

CLIENT_CLOSED = 499
"""The status logged and counted for a request whose client went away before it was
answered (nginx's "client closed request"): no answer reaches anyone, and it is not the
relay's failure, so it is neither a 5xx nor a traceback."""

if TYPE_CHECKING:
    from melchior.mellan.relay.metrics import Metrics

access_log = logging.getLogger("melchior.mellan.access")

LOG_FORMATS = ("text", "json")
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def route_template(scope: Scope) -> str:
    """The route that served a request, as a template with a bounded set of values: an
    A2A operation by binding and name (set by the entry on ``request.state.route``), else
    the matched route's path under its mounts, else ``unmatched``."""
    state = scope.get("state") or {}
    named = state.get("route") if isinstance(state, dict) else None
    if isinstance(named, str):
        return named
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return str(scope.get("root_path", "")) + path
    return "unmatched"


class Observe:
    def __init__(self, app: ASGIApp, metrics: Metrics | None = None) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = None
        for key, value in scope["headers"]:
            if key == b"x-request-id":
                incoming = value.decode("latin-1")
                break
        rid = requestid.accept(incoming)
        token = requestid.current_id.set(rid)
        started = time.perf_counter()
        answered = False

        async def send_with_id(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True
                MutableHeaders(scope=message).append(requestid.HEADER, rid)
                self._done(scope, message["status"], time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:  # outside a mount's handlers: still a normal end
            if not answered:
                self._done(scope, CLIENT_CLOSED, time.perf_counter() - started)
        except BaseException:
            if not answered:
                self._done(scope, 500, time.perf_counter() - started)
            raise
        finally:
            requestid.current_id.reset(token)

    def _done(self, scope: Scope, status: int, seconds: float) -> None:
        route = route_template(scope)
        method = str(scope.get("method", ""))
        if self.metrics is not None:
            self.metrics.requests.observe(seconds, route=route, method=method, status=str(status))
        access_log.info(
            "%s %s %d %.1f ms",
            method,
            scope.get("path", ""),
            status,
            seconds * 1000,
            extra={"route": route, "status": status, "duration_ms": round(seconds * 1000, 1)},
        )


class RequestIdFilter(logging.Filter):
    """Every log record gets the id of the request it was logged for (or None)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = requestid.current()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line; fields passed with ``extra=`` are kept."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"mellan relay: {record.levelname} {record.getMessage()}"
        rid = getattr(record, "request_id", None)
        if rid:
            line += f" [request {rid}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(
    fmt: str = "text", *, access: bool = False, stream: TextIO | None = None
) -> None:
    """Install the relay's log handler on the root logger: ``json`` or ``text`` lines,
    every one with its request id; access lines only with ``access``."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    access_log.setLevel(logging.INFO if access else logging.WARNING)
