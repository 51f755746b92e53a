"""What every ``mellan`` client command shares: where the relay and token come from, one
HTTP call with refusals turned into plain sentences, and JSON or table output.

The relay URL comes from ``--relay``, else ``$MELLAN_RELAY``, else the stored login; the
token from ``$MELLAN_TOKEN``, else the stored login. Tokens are never taken as command
line arguments (they would show in ``ps`` and shell history). Every request goes through
:mod:`melchior.mellan.transport`: certificates verified (``--ca-file``, ``$MELLAN_CA_FILE``
or the stored ``ca_file``), and no credential over plain HTTP to a non-loopback host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from melchior import __version__
from melchior.mellan.rawjson import decode, encode

if TYPE_CHECKING:
    from melchior.mellan.transport import ClientTls

DEFAULT_RELAY = "http://127.0.0.1:8787"
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


class CliError(Exception):
    """A failure to report as one line on stderr, with an exit status."""

    def __init__(self, message: str, status: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.status = status


def config_dir() -> Path:
    from melchior.files import xdg

    return xdg("config") / "mellan"


def login_file() -> Path:
    return config_dir() / "login.json"


def write_private_json(path: Path, data: dict[str, Any]) -> None:
    """Write a credential file readable by its owner only (0600, directory 0700)."""
    from melchior.files import write_private

    write_private(path, json.dumps(data, indent=2) + "\n")


def read_login() -> dict[str, Any]:
    path = login_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read the stored login {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Target:
    relay: str
    token: str | None
    tls: ClientTls | None = None
    """CA file and client certificate (None: from the environment only)."""


def client_tls(ns: argparse.Namespace, stored: dict[str, Any] | None = None) -> ClientTls:
    """``--ca-file``, else ``$MELLAN_CA_FILE``, else the stored credential's ``ca_file``."""
    from melchior.mellan.transport import TransportError
    from melchior.mellan.transport import client_tls as pick

    try:
        return pick(getattr(ns, "ca_file", None), stored)
    except TransportError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def agent_file(agent: str) -> Path:
    """Where ``mellan join`` keeps an agent's credential."""
    return config_dir() / "agents" / f"{agent}.json"


def read_agent(agent: str) -> dict[str, Any]:
    path = agent_file(agent)
    if not path.exists():
        raise CliError(
            f"no stored credential for agent {agent!r} ({path}); run 'mellan join CODE "
            "--relay URL' on this machine first",
            EXIT_USAGE,
        )
    return _read_credential(path)


def _read_credential(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or "token" not in data:
        raise CliError(f"{path} is not a mellan agent credential", EXIT_USAGE)
    return data


@dataclass(frozen=True)
class AgentCredential:
    relay: str
    token: str
    workspace: str | None
    tls: ClientTls | None = None


def stored_agents() -> list[Path]:
    root = config_dir() / "agents"
    return sorted(root.rglob("*.json")) if root.is_dir() else []


def agent_credential(ns: argparse.Namespace) -> AgentCredential:
    """An *agent* credential, by the same precedence as :func:`target`: ``--as AGENT`` (a
    stored join), else ``$MELLAN_TOKEN``, else — where an owner login would follow — the
    only agent credential stored on this machine."""
    relay = getattr(ns, "relay", None) or os.environ.get("MELLAN_RELAY")
    as_agent = getattr(ns, "as_agent", None)
    if as_agent:
        joined = read_agent(as_agent)
    elif os.environ.get("MELLAN_TOKEN"):
        token = os.environ["MELLAN_TOKEN"]
        login = read_login()
        url = relay or login.get("relay") or DEFAULT_RELAY
        return AgentCredential(str(url).rstrip("/"), token, None, client_tls(ns, login))
    else:
        found = stored_agents()
        if len(found) != 1:
            listed = ", ".join(str(p) for p in found) if found else "none stored"
            raise CliError(
                f"no agent credential: pass --as AGENT or set MELLAN_TOKEN ({listed})", EXIT_USAGE
            )
        joined = _read_credential(found[0])
    url = relay or joined.get("relay") or DEFAULT_RELAY
    workspace = joined.get("workspace")
    return AgentCredential(
        str(url).rstrip("/"),
        str(joined["token"]),
        str(workspace) if workspace else None,
        client_tls(ns, joined),
    )


def target(ns: argparse.Namespace, *, need_token: bool = True) -> Target:
    """Relay and credential. The one rule of precedence, for every command: the credential
    of ``--as AGENT`` (a stored join), else ``$MELLAN_TOKEN``, else the stored login; the
    relay from ``--relay``, else ``$MELLAN_RELAY``, else the stored one."""
    as_agent = getattr(ns, "as_agent", None)
    if as_agent:
        joined = read_agent(as_agent)
        relay_url = getattr(ns, "relay", None) or joined["relay"]
        return Target(str(relay_url).rstrip("/"), str(joined["token"]), client_tls(ns, joined))
    stored = read_login()
    relay = (
        getattr(ns, "relay", None)
        or os.environ.get("MELLAN_RELAY")
        or stored.get("relay")
        or DEFAULT_RELAY
    )
    token = os.environ.get("MELLAN_TOKEN") or stored.get("token")
    if need_token and not token:
        raise CliError(
            "no credential: set MELLAN_TOKEN, or run 'mellan login --relay URL --token-file "
            "PATH' with the owner token file the relay printed at first start",
            EXIT_USAGE,
        )
    return Target(str(relay).rstrip("/"), token, client_tls(ns, stored))


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
    content = None
    if body is not None:
        headers["content-type"] = "application/json"
        content = encode(body).encode("utf-8")
    clean = {k: v for k, v in (params or {}).items() if v is not None}
    try:
        http = transport.client(t.relay, t.token, t.tls, secret=secret, timeout=timeout)
    except transport.TransportError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    try:
        with http:
            response = http.request(
                method, t.relay + path, headers=headers, content=content, params=clean
            )
    except httpx.HTTPError as exc:
        untrusted = transport.untrusted(exc)
        if untrusted:
            raise CliError(f"{t.relay}: {untrusted}", EXIT_UNREACHABLE) from exc
        raise CliError(
            f"cannot reach the relay at {t.relay}: {exc or type(exc).__name__} (is 'mellan relay' "
            "running there? set --relay or MELLAN_RELAY)",
            EXIT_UNREACHABLE,
        ) from exc
    try:
        data = decode(response.content) if response.content else {}
    except ValueError:
        data = None
    if response.is_success:
        return data
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        reason = (
            f"{error.get('reason', '')} ({error.get('code', 'error')}, HTTP {response.status_code})"
        )
    else:
        reason = f"HTTP {response.status_code} from {t.relay}{path}: {response.text[:200]}"
    status = EXIT_UNREACHABLE if response.status_code == 503 else EXIT_REFUSED
    raise CliError(f"refused: {reason}", status)


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


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (no colours: it is piped as often as read)."""
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))]
    for row in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(line.rstrip() for line in lines)


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
