"""Which credential, relay and TLS files a mellan client uses: the one rule, from values.

Every client of a relay (the ``mellan`` commands, ``mellan send``, the receiver's
configuration, the MCP bridge's relay caller, a program using
:class:`melchior.mellan.RelayClient`) picks its credential by the same precedence:

- the credential of ``as_agent`` (the file ``mellan join`` stored for that agent), else
- ``$MELLAN_TOKEN``, else
- the stored owner login (:func:`target`), or — where an *agent* is needed
  (:func:`agent_credential`) — the only agent credential stored on this machine;

the relay URL from the explicit value (``--relay``), else ``$MELLAN_RELAY``, else the one
stored with the credential, else :data:`DEFAULT_RELAY`; the TLS files by
:func:`melchior.mellan.transport.client_tls` (explicit CA file, environment, stored).

It takes plain values and an environment mapping, never an argparse namespace, so code
that is not the command line can ask the same question and get the same answer; the
command line only parses flags into these arguments and prints what goes wrong.
Failures are :class:`CredentialError`, whose ``usage`` says whether the fix is in how
the client was invoked (no credential, a missing stored join) rather than in a file.

Tokens are never taken as arguments on a command line (they would show in ``ps`` and
shell history); here they come from the environment or a private file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from melchior.mellan.transport import ClientTls, TransportError
from melchior.mellan.transport import client_tls as _pick_tls

DEFAULT_RELAY = "http://127.0.0.1:8787"
TOKEN_ENV = "MELLAN_TOKEN"
RELAY_ENV = "MELLAN_RELAY"


class CredentialError(ValueError):
    """No usable credential; the message says which and what to do.

    ``usage`` is true when the fix is in how the client was called (pass ``--as``, set
    ``$MELLAN_TOKEN``, run ``mellan join``), false when a file could not be read."""

    def __init__(self, message: str, *, usage: bool = True) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass(frozen=True)
class Target:
    """A relay and the credential to use there (None: a call that needs none)."""

    relay: str
    token: str | None
    tls: ClientTls | None = None
    """CA file and client certificate (None: from the environment only)."""


@dataclass(frozen=True)
class AgentCredential:
    """An *agent's* credential: its relay, token, workspace (if stored) and TLS files."""

    relay: str
    token: str
    workspace: str | None
    tls: ClientTls | None = None


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/mellan`` (default ``~/.config/mellan``)."""
    from melchior.files import xdg

    return xdg("config", environ) / "mellan"


def login_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``mellan login`` keeps the owner's relay and token."""
    return config_dir(environ) / "login.json"


def agent_file(agent: str, environ: Mapping[str, str] | None = None) -> Path:
    """Where ``mellan join`` keeps an agent's credential."""
    return config_dir(environ) / "agents" / f"{agent}.json"


def stored_agents(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Every agent credential stored on this machine, sorted."""
    root = config_dir(environ) / "agents"
    return sorted(root.rglob("*.json")) if root.is_dir() else []


def write_private_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write a credential file readable by its owner only (0600, directory 0700)."""
    from melchior.files import write_private

    write_private(path, json.dumps(dict(data), indent=2) + "\n")


def read_login(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The stored owner login, or ``{}`` when there is none."""
    path = login_file(environ)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CredentialError(f"cannot read the stored login {path}: {exc}", usage=False) from exc
    return data if isinstance(data, dict) else {}


def read_credential(path: Path) -> dict[str, Any]:
    """One stored agent credential file: a JSON object with a ``token``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CredentialError(f"cannot read {path}: {exc}", usage=False) from exc
    if not isinstance(data, dict) or not isinstance(data.get("token"), str):
        raise CredentialError(f"{path} is not a mellan agent credential")
    return data


def read_agent(agent: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The credential ``mellan join`` stored for ``agent``; refused when there is none."""
    path = agent_file(agent, environ)
    if not path.exists():
        raise CredentialError(
            f"no stored credential for agent {agent!r} ({path}); run 'mellan join CODE "
            "--relay URL' on this machine first"
        )
    return read_credential(path)


def tls_for(
    ca_file: str | Path | None,
    stored: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClientTls:
    """The TLS files: ``ca_file``, else ``$MELLAN_CA_FILE``, else the stored ``ca_file``."""
    try:
        return _pick_tls(ca_file, stored, environ)
    except TransportError as exc:
        raise CredentialError(str(exc)) from None


def agent_credential(
    *,
    as_agent: str | None = None,
    relay: str | None = None,
    ca_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> AgentCredential:
    """An *agent* credential by the one precedence: ``as_agent`` (a stored join), else
    ``$MELLAN_TOKEN``, else — where an owner login would follow — the only agent
    credential stored on this machine."""
    env = os.environ if environ is None else environ
    url = relay or env.get(RELAY_ENV)
    if as_agent:
        joined = read_agent(as_agent, env)
    elif env.get(TOKEN_ENV):
        login = read_login(env)
        found = url or login.get("relay") or DEFAULT_RELAY
        tls = tls_for(ca_file, login, env)
        return AgentCredential(str(found).rstrip("/"), env[TOKEN_ENV], None, tls)
    else:
        found_files = stored_agents(env)
        if len(found_files) != 1:
            listed = ", ".join(str(p) for p in found_files) if found_files else "none stored"
            raise CredentialError(
                f"no agent credential: pass --as AGENT or set {TOKEN_ENV} ({listed})"
            )
        joined = read_credential(found_files[0])
    chosen = url or joined.get("relay") or DEFAULT_RELAY
    workspace = joined.get("workspace")
    return AgentCredential(
        str(chosen).rstrip("/"),
        str(joined["token"]),
        str(workspace) if workspace else None,
        tls_for(ca_file, joined, env),
    )


def target(
    *,
    as_agent: str | None = None,
    relay: str | None = None,
    ca_file: str | Path | None = None,
    need_token: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Target:
    """Relay and credential for any command: the credential of ``as_agent`` (a stored
    join), else ``$MELLAN_TOKEN``, else the stored login; the relay from ``relay``, else
    ``$MELLAN_RELAY``, else the stored one. ``need_token=False``: a call that may go
    without one (``mellan join`` carries a code instead)."""
    env = os.environ if environ is None else environ
    if as_agent:
        joined = read_agent(as_agent, env)
        url = relay or joined.get("relay") or DEFAULT_RELAY
        return Target(str(url).rstrip("/"), str(joined["token"]), tls_for(ca_file, joined, env))
    stored = read_login(env)
    url = relay or env.get(RELAY_ENV) or stored.get("relay") or DEFAULT_RELAY
    token = env.get(TOKEN_ENV) or stored.get("token")
    if need_token and not token:
        raise CredentialError(
            f"no credential: set {TOKEN_ENV}, or run 'mellan login --relay URL --token-file "
            "PATH' with the owner token file the relay printed at first start"
        )
    tls = tls_for(ca_file, stored, env)
    return Target(str(url).rstrip("/"), str(token) if token else None, tls)
