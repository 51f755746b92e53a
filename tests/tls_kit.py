"""Certificates made in the test (trustme) for the HTTPS tests of the relay, the receiver
and the gRPC binding: a server pair for loopback, a CA file to trust, a client that
verifies against it, and two agents set up over the verified connection."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx
import trustme

from relay_proc import RelayProc


def server_pair(ca: trustme.CA, where: Path, name: str = "relay") -> tuple[Path, Path]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    crt, key = where / f"{name}.crt", where / f"{name}.key"
    crt.write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key))
    return crt, key


def ca_file(ca: trustme.CA, where: Path, name: str = "ca.pem") -> Path:
    path = where / name
    ca.cert_pem.write_to_path(str(path))
    return path


def verified(cafile: Path, **kw: Any) -> httpx.Client:
    return httpx.Client(verify=ssl.create_default_context(cafile=str(cafile)), timeout=30, **kw)


def setup_agents(relay: RelayProc, cafile: Path) -> tuple[str, str]:
    """private/ops and local/codex with a grant; their tokens (caller, receiver)."""
    tokens = []
    with verified(cafile, base_url=relay.url) as c:
        h = {"authorization": f"Bearer {relay.owner_token}"}
        for agent, caps in (("private/ops", ["incident.inspect"]), ("local/codex", [])):
            r = c.post("/api/agents", json={"id": agent, "capabilities": caps}, headers=h)
            assert r.status_code == 201, r.text
        grant = {"caller": "local/codex", "receiver": "private/ops",
                 "capabilities": ["incident.inspect"]}  # fmt: skip
        assert c.post("/api/grants", json=grant, headers=h).status_code == 201
        for agent in ("local/codex", "private/ops"):
            code = c.post("/api/enrollments", json={"agent": agent}, headers=h).json()["code"]
            tokens.append(c.post("/api/join", json={"code": code}).json()["token"])
    return tokens[0], tokens[1]
