"""How every mellan client reaches a relay: the one place an HTTP client is built.

Rules it holds for the ``mellan`` CLI, ``mellan send``, the receiver API client and the
MCP bridge's relay caller alike:

- **never a credential in clear across the network**: a bearer token (or an enrollment
  code, which mints one) is refused over ``http://`` to anything but a loopback host,
  before any byte is sent — a relay reached over plain HTTP from another machine hands
  the token to whoever is on the path;
- **certificates are verified**: against the CA file given (``--ca-file``, else
  ``$MELLAN_CA_FILE``, else the ``ca_file`` key of the stored login or join), else
  against the usual public roots. There is no switch to turn verification off: a test
  CA is a file away (docs/operations.md);
- **a client certificate** is presented when configured (``$MELLAN_CLIENT_CERT`` and
  ``$MELLAN_CLIENT_KEY``, else the stored ``client_cert``/``client_key``): the relay's
  receiver API may require one (mTLS).
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from melchior.policy.outbound import may_carry_credential

CA_FILE_ENV = "MELLAN_CA_FILE"
CLIENT_CERT_ENV = "MELLAN_CLIENT_CERT"
CLIENT_KEY_ENV = "MELLAN_CLIENT_KEY"


class TransportError(ValueError):
    """A relay URL or TLS setting this client will not use; the message says why."""


@dataclass(frozen=True)
class ClientTls:
    """Where this client's trust and identity come from (all optional)."""

    ca_file: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None

    def stored(self) -> dict[str, str]:
        """The keys a credential file keeps, so later commands use the same CA."""
        out = {"ca_file": self.ca_file, "client_cert": self.client_cert,
               "client_key": self.client_key}  # fmt: skip
        return {k: str(Path(v).resolve()) for k, v in out.items() if v is not None}


def client_tls(
    ca_file: str | Path | None = None,
    stored: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClientTls:
    """By precedence: the explicit argument (a flag), the environment, the stored file."""
    env = os.environ if environ is None else environ
    saved = stored or {}

    def pick(given: str | Path | None, var: str, key: str) -> Path | None:
        value = given or env.get(var) or saved.get(key)
        return Path(str(value)).expanduser() if value else None

    tls = ClientTls(
        pick(ca_file, CA_FILE_ENV, "ca_file"),
        pick(None, CLIENT_CERT_ENV, "client_cert"),
        pick(None, CLIENT_KEY_ENV, "client_key"),
    )
    if tls.client_key is not None and tls.client_cert is None:
        raise TransportError(f"${CLIENT_KEY_ENV} is set but ${CLIENT_CERT_ENV} is not")
    return tls


def check_url(url: str, *, credential: bool) -> None:
    """Refuse a relay URL this client must not use (rule: no credential in clear, the one
    decision :func:`melchior.policy.outbound.may_carry_credential`)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TransportError(f"relay URL {url!r} must be http(s)://HOST[:PORT]")
    if credential and not may_carry_credential(url):
        raise TransportError(
            f"refusing to send a credential over plain HTTP to {parts.hostname}: anyone on "
            "the network path could read and reuse it. Use the relay's https:// URL "
            "(mellan relay --tls-cert/--tls-key, docs/operations.md)"
        )


@functools.cache
def public_roots() -> ssl.SSLContext:
    """A verifying context trusting the usual public roots, made once per process and
    shared: loading the roots costs ~20 ms of CPU each time, and every client httpx
    makes with its defaults loads them again (the relay's pusher and waker each made
    one at start). Shared unmodified only: a client certificate needs a context of its
    own (:func:`ssl_context`)."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def trusting_nobody() -> ssl.SSLContext:
    """The TLS settings of a client for a plain ``http://`` relay: verifying, with no
    root at all, so no certificate is ever trusted. Such a client never speaks TLS
    (redirects are not followed); without it httpx would load the public roots for it
    anyway, a fifth of a short command's CPU. Made fresh each time (it is cheap), so no
    caller can add trust to another's."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname checked, certificate required


def ssl_context(tls: ClientTls) -> ssl.SSLContext:
    """A verifying context: the CA file if given (and only it), else the public roots."""
    if tls.ca_file is None and tls.client_cert is None:
        return public_roots()
    try:
        if tls.ca_file is not None:
            ctx = ssl.create_default_context(cafile=str(tls.ca_file))
        else:  # the public roots in a context of its own, for the certificate added below
            ctx = public_roots.__wrapped__()
    except FileNotFoundError:
        raise TransportError(f"CA file {tls.ca_file} does not exist") from None
    except (OSError, ssl.SSLError) as exc:
        raise TransportError(f"CA file {tls.ca_file} does not load: {exc}") from None
    if tls.client_cert is not None:
        try:
            ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key or tls.client_cert))
        except FileNotFoundError as exc:
            raise TransportError(f"client certificate file {exc.filename} does not exist") from None
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(
                f"client certificate {tls.client_cert} (key {tls.client_key}) does not load: {exc}"
            ) from None
    return ctx


def client_options(
    url: str, token: str | None, tls: ClientTls | None = None, *, secret: bool = False
) -> dict[str, Any]:
    """Keyword arguments for ``httpx.Client``/``AsyncClient``: checked URL, verifying TLS,
    the bearer header. ``secret`` marks a call that carries a credential in its body."""
    check_url(url, credential=bool(token) or secret)
    options: dict[str, Any] = {"follow_redirects": False}
    https = urlsplit(url).scheme == "https"
    options["verify"] = ssl_context(tls or client_tls()) if https else trusting_nobody()
    if token:
        options["headers"] = {"authorization": f"Bearer {token}"}
    return options


def untrusted(exc: BaseException) -> str | None:
    """A sentence for a failed TLS verification (else None): what to do about it."""
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        return (
            f"the relay's TLS certificate does not verify ({text}); if it is signed by your "
            f"own CA, pass it with --ca-file FILE or ${CA_FILE_ENV}"
        )
    if "TLSV13_ALERT_CERTIFICATE_REQUIRED" in text or "CERTIFICATE_REQUIRED" in text:
        return (
            f"the relay requires a client certificate ({text}); set ${CLIENT_CERT_ENV} and "
            f"${CLIENT_KEY_ENV}"
        )
    return None


def client(
    url: str,
    token: str | None,
    tls: ClientTls | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    secret: bool = False,
    **kwargs: Any,
) -> httpx.Client:
    """A synchronous client for one relay (``url`` is only checked, not made the base)."""
    options = client_options(url, token, tls, secret=secret)
    options["headers"] = {**options.get("headers", {}), **(headers or {})}
    return httpx.Client(**(options | kwargs))


def async_client(
    url: str,
    token: str | None,
    tls: ClientTls | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> httpx.AsyncClient:
    """An asynchronous client for one relay, by the same rules as :func:`client`."""
    options = client_options(url, token, tls)
    options["headers"] = {**options.get("headers", {}), **(headers or {})}
    return httpx.AsyncClient(**(options | kwargs))
