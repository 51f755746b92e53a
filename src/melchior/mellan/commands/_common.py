"""What every ``mellan`` client command shares: flags, one HTTP call with refusals
turned into plain sentences, and JSON or table output.

Which relay, token and TLS files a command uses is not decided here: the flags
(``--as``, ``--relay``, ``--ca-file``) are handed as values to
:mod:`melchior.mellan.credentials`, the one rule for every client, and its refusals are
printed as usage errors. Every request goes through :mod:`melchior.mellan.transport`:
certificates verified, and no credential over plain HTTP to a non-loopback host.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from melchior import __version__
from melchior.mellan import credentials
from melchior.mellan.credentials import (  # re-exported for the commands
    DEFAULT_RELAY,
    AgentCredential,
    CredentialError,
    Target,
    agent_file,
    login_file,
    write_private_json,
)
from melchior.mellan.rawjson import decode, encode
from melchior.mellan.table import table
from melchior.mellan.transport import ClientTls

if TYPE_CHECKING:
    from melchior.mellan.client.errors import RelayError

__all__ = [
    "DEFAULT_RELAY",
    "AgentCredential",
    "CliError",
    "Target",
    "agent_file",
    "login_file",
    "table",
    "write_private_json",
]
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


class CliError(Exception):
    """A failure to report as one line on stderr, with an exit status."""

    def __init__(self, message: str, status: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.status = status


def _cli(exc: CredentialError) -> CliError:
    return CliError(str(exc), EXIT_USAGE if exc.usage else EXIT_REFUSED)


def read_login() -> dict[str, Any]:
    try:
        return credentials.read_login()
    except CredentialError as exc:
        raise _cli(exc) from None


def client_tls(ns: argparse.Namespace, stored: dict[str, Any] | None = None) -> ClientTls:
    """``--ca-file``, else ``$MELLAN_CA_FILE``, else the stored credential's ``ca_file``."""
    try:
        return credentials.tls_for(getattr(ns, "ca_file", None), stored)
    except CredentialError as exc:
        raise _cli(exc) from None


def agent_credential(ns: argparse.Namespace) -> AgentCredential:
    """An *agent* credential from ``--as``, ``--relay`` and ``--ca-file`` by the one rule
    of :func:`melchior.mellan.credentials.agent_credential`."""
    try:
        return credentials.agent_credential(
            as_agent=getattr(ns, "as_agent", None),
            relay=getattr(ns, "relay", None),
            ca_file=getattr(ns, "ca_file", None),
        )
    except CredentialError as exc:
        raise _cli(exc) from None


def target(ns: argparse.Namespace, *, need_token: bool = True) -> Target:
    """Relay and credential from ``--as``, ``--relay`` and ``--ca-file`` by the one rule
    of :func:`melchior.mellan.credentials.target`."""
    try:
        return credentials.target(
            as_agent=getattr(ns, "as_agent", None),
            relay=getattr(ns, "relay", None),
            ca_file=getattr(ns, "ca_file", None),
            need_token=need_token,
        )
    except CredentialError as exc:
        raise _cli(exc) from None


def call(
    t: Target,
    method: str,
    path: str,
    body: Any = None,
    params: dict[str, Any] | None = None,
    timeout: float = 30.0,
    *,
    secret: bool = False,
) -> Any:
    """One request to the relay; the decoded JSON answer, or CliError with the relay's reason.
    ``secret``: the body carries a credential (an enrollment code) though no token does."""
    import httpx  # here, so --help and argument errors never pay for importing it

    from melchior.mellan import transport

    headers = {"accept": "application/json"}
    payload = None
    if body is not None:
        headers["content-type"] = "application/json"
        payload = encode(body).encode("utf-8")
    clean = {k: v for k, v in (params or {}).items() if v is not None}
    try:
        http = transport.client(t.relay, t.token, t.tls, secret=secret, timeout=timeout)
    except transport.TransportError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    from melchior.mellan.client.caller import MAX_ANSWER
    from melchior.mellan.client.errors import refusal

    answer = b""
    try:
        with (
            http,
            http.stream(
                method, t.relay + path, headers=headers, content=payload, params=clean
            ) as response,
        ):
            got = bytearray()
            for chunk in response.iter_bytes():  # bounded: a relay's answer, never a stream
                got += chunk
                if len(got) > MAX_ANSWER:
                    raise CliError(f"refused: the relay's answer exceeds {MAX_ANSWER} bytes")
            answer = bytes(got)
    except httpx.HTTPError as exc:
        untrusted = transport.untrusted(exc)
        if untrusted:
            raise CliError(f"{t.relay}: {untrusted}", EXIT_UNREACHABLE) from exc
        raise CliError(
            f"cannot reach the relay at {t.relay}: {exc or type(exc).__name__} (is 'mellan relay' "
            "running there? set --relay or MELLAN_RELAY)",
            EXIT_UNREACHABLE,
        ) from exc
    if not response.is_success:
        raise cli_refusal(refusal(response.status_code, answer, response.headers, t.relay + path))
    try:
        return decode(answer) if answer else {}
    except ValueError:
        return None


def cli_refusal(exc: RelayError) -> CliError:
    """A relay's refusal (or no answer) as the CLI says it: ``refused: …`` with exit 1, or
    exit 3 when the relay could not be reached or its store is down."""
    if exc.status is None:
        return CliError(str(exc), EXIT_UNREACHABLE if exc.unreachable else EXIT_REFUSED)
    return CliError(f"refused: {exc}", EXIT_UNREACHABLE if exc.unreachable else EXIT_REFUSED)


def add_common(parser: argparse.ArgumentParser, *, relay: bool = True) -> None:
    parser.add_argument("--version", action="version", version=f"mellan {__version__}")
    parser.add_argument("--json", action="store_true", help="print the relay's JSON answer")
    add_ca_file(parser)
    if relay:
        parser.add_argument(
            "--relay", metavar="URL", help="relay URL (default: $MELLAN_RELAY or stored login)"
        )
        parser.add_argument(
            "--as",
            dest="as_agent",
            metavar="AGENT",
            help="act with the agent credential 'mellan join' stored for AGENT",
        )


def add_ca_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ca-file",
        metavar="FILE",
        help="CA certificate(s) (PEM) to verify the relay's HTTPS certificate with "
        "(default: $MELLAN_CA_FILE, the stored login's, else the public roots)",
    )


def print_json(data: Any) -> None:
    print(encode(data))


def guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a command, printing a CliError as ``mellan: …`` on stderr with its exit status."""

    def run(ns: argparse.Namespace) -> int:
        try:
            return fn(ns)
        except CliError as exc:
            print(f"mellan: {exc}", file=sys.stderr)
            return exc.status
        except KeyboardInterrupt:
            return 130

    return run


def subcommands(
    parser: argparse.ArgumentParser,
    table_: dict[
        str,
        tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]],
    ],
) -> None:
    """Attach ``COMMAND SUB`` subparsers; each gets --help, --version, --json and --relay."""
    parser.add_argument("--version", action="version", version=f"mellan {__version__}")
    subs = parser.add_subparsers(dest="sub", metavar="SUBCOMMAND", required=True)
    for name, (text, add, run) in table_.items():
        sp = subs.add_parser(name, help=text, description=text)
        add_common(sp)
        add(sp)
        sp.set_defaults(func=guarded(run))


def dispatch(ns: argparse.Namespace) -> int:
    func: Callable[[argparse.Namespace], int] = ns.func
    return func(ns)
