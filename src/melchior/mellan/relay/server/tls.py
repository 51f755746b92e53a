"""HTTPS for the relay: one live ``ssl.SSLContext``, reloaded in place on SIGHUP, and the
receiver API's client-certificate rule (mTLS).

Reload in place, not swap: the listening socket was handed the context when it started,
so loading the new pair into *that* context means the next handshake uses it while
connections already open keep the session they negotiated. The new pair is first loaded
into a scratch context; a pair that does not load (missing file, key not matching the
certificate, bad PEM) leaves the live one untouched and the reason is logged.

With ``--client-ca`` the relay asks every client for a certificate (``CERT_OPTIONAL``: a
browser on the dashboard or an owner's CLI need none, but one presented must verify
against that CA or the handshake fails), and :class:`ClientCertGate` *requires* a verified
one on ``/api/receiver/*``: those paths take and complete work, so a stolen bearer token
alone should not be enough there.
"""

from __future__ import annotations

import json
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("mellan.relay.tls")

RECEIVER_PREFIX = "/api/receiver/"
MTLS_RULE = "mtls"


class TlsError(Exception):
    """A certificate/key pair (or client CA) that cannot be loaded; the message says why."""


def _load_pair(ctx: ssl.SSLContext, cert: Path, key: Path) -> None:
    try:
        ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except FileNotFoundError as exc:
        raise TlsError(f"{exc.filename or cert}: no such file") from None
    except ssl.SSLError as exc:
        raise TlsError(f"{cert} / {key} do not load as a certificate and its key: {exc}") from None
    except OSError as exc:
        raise TlsError(f"cannot read {cert} / {key}: {exc.strerror or exc}") from None


@dataclass
class ServerTls:
    """The live server context and the files it is (re)loaded from."""

    cert: Path
    key: Path
    client_ca: Path | None = None
    context: ssl.SSLContext | None = None

    def build(self) -> ssl.SSLContext:
        """The context to serve with; TlsError if the pair or the client CA do not load."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        _load_pair(ctx, self.cert, self.key)
        if self.client_ca is not None:
            try:
                ctx.load_verify_locations(cafile=str(self.client_ca))
            except (OSError, ssl.SSLError) as exc:
                raise TlsError(f"client CA {self.client_ca} does not load: {exc}") from None
            ctx.verify_mode = ssl.CERT_OPTIONAL
        self.context = ctx
        return ctx

    def reload(self) -> str:
        """Load the pair again into the live context; returns what happened, for the log.
        A pair that fails to load in a scratch context is never loaded into the live one."""
        assert self.context is not None
        try:
            _load_pair(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), self.cert, self.key)
            _load_pair(self.context, self.cert, self.key)
        except TlsError as exc:
            message = f"certificate reload failed, still serving the previous one: {exc}"
            log.error(message)
            return message
        message = f"certificate reloaded from {self.cert}; new connections use it"
        log.info(message)
        return message


def peer_tls(ssl_object: Any) -> dict[str, Any]:
    """The ASGI TLS extension's view of a connection: the verified client certificate, if
    any. ``getpeercert()`` only returns a certificate the context verified."""
    cert = ssl_object.getpeercert()
    name = None
    if cert:
        for rdn in cert.get("subject", ()):
            for field, value in rdn:
                if field == "commonName":
                    name = value
    der = ssl_object.getpeercert(binary_form=True) if cert else None
    return {
        "server_cert": None,
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        "client_cert_name": name,
        "client_cert_error": None,
        "tls_version": None,
        "cipher_suite": None,
        "client_cert_verified": bool(cert),
    }


class ClientCertGate:
    """ASGI middleware: ``/api/receiver/*`` requires a verified client certificate (403
    saying why otherwise). Everything else passes through untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(RECEIVER_PREFIX):
            tls = scope.get("extensions", {}).get("tls") or {}
            if not tls.get("client_cert_verified"):
                reason = (
                    "the receiver API requires a client certificate signed by this relay's "
                    "client CA (mTLS); present one (MELLAN_CLIENT_CERT / MELLAN_CLIENT_KEY)"
                )
                if scope.get("scheme") != "https":
                    reason = "the receiver API requires HTTPS with a client certificate (mTLS)"
                body = json.dumps(
                    {"error": {"code": "client-certificate-required", "reason": reason,
                               "rule": MTLS_RULE}}
                ).encode()  # fmt: skip
                await send(
                    {
                        "type": "http.response.start",
                        "status": 403,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
