"""HTTPS end to end, with certificate authorities made in the test (trustme): a real
``mellan relay`` serving TLS, the ``mellan`` CLI, ``mellan send`` and the receiver API
client verifying it, a wrong CA refused, SIGHUP reloading the pair for new connections
while an open one keeps working, client certificates on the receiver API (mTLS), and no
credential ever sent over plain HTTP to another machine."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan import transport
from melchior.mellan.client.receiver import ClaimedTask, ReceiverClient, ReceiverError
from relay_proc import MELLAN, RelayProc, relay_env, start_relay, wait_line
from tls_kit import ca_file, server_pair, setup_agents, verified

DEADLINE = 60.0  # for something that must happen; never a measured threshold


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA(organization_name="mellan test CA")


class Cli:
    """``mellan`` as a user on another machine runs it: its own XDG dirs, env only."""

    def __init__(self, home: Path, **env: str) -> None:
        self.env = relay_env(home) | env

    def run(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [MELLAN, *args], capture_output=True, text=True, env=self.env, timeout=120
        )
        assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
        return proc


@pytest.fixture
def https_relay(ca: trustme.CA, tmp_path: Path) -> Iterator[RelayProc]:
    crt, key = server_pair(ca, tmp_path)
    relay = start_relay(
        f"sqlite://{tmp_path / 'relay.db'}", tmp_path, "--tls-cert", str(crt), "--tls-key", str(key)
    )
    try:
        yield relay
    finally:
        relay.stop()


def claim_one(rc: ReceiverClient, wait: float = 25.0) -> ClaimedTask:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        got = rc.claim(wait=wait)
        if got:
            return got[0]
    pytest.fail("nothing to claim")


def test_cli_send_and_receiver_verify_an_https_relay(
    https_relay: RelayProc, ca: trustme.CA, tmp_path: Path
) -> None:
    relay = https_relay
    assert relay.url.startswith("https://127.0.0.1:")
    cafile = ca_file(ca, tmp_path)
    owner = Cli(tmp_path / "owner")
    # login with --ca-file stores it: later commands verify with it without being told
    owner.run("login", "--relay", relay.url, "--token-file", str(relay.token_file),
              "--ca-file", str(cafile))  # fmt: skip
    login = json.loads((tmp_path / "owner/config/mellan/login.json").read_text())
    assert login["ca_file"] == str(cafile)
    owner.run("agent", "add", "private/ops", "--capability", "incident.inspect")
    owner.run("agent", "add", "local/codex")
    owner.run("grant", "add", "local/codex", "private/ops", "incident.inspect")
    # the agent's machine: the CA from the environment
    agent = Cli(tmp_path / "agent", MELLAN_CA_FILE=str(cafile))
    for name in ("local/codex", "private/ops"):
        code = owner.run("enroll", name).stdout.splitlines()[0].strip()
        agent.run("join", code, "--relay", relay.url)
    sent = agent.run("send", "private/ops", "hello over TLS", "--as", "local/codex",
                     "--capability", "incident.inspect", "--json")  # fmt: skip
    task_id = json.loads(sent.stdout)["task"]["id"]
    stored = json.loads((tmp_path / "agent/config/mellan/agents/private/ops.json").read_text())
    with ReceiverClient(relay.url, stored["token"], ca_file=cafile) as rc:
        lease = claim_one(rc)
        assert lease.task_id == task_id
        assert rc.complete(lease.task_id, lease.epoch, {"message": {"parts": [
            {"text": "done"}]}}).ok  # fmt: skip
    shown = owner.run("task", "get", task_id, "--json").stdout
    assert json.loads(shown)["state"] == "succeeded"


def test_a_wrong_ca_is_refused(https_relay: RelayProc, tmp_path: Path) -> None:
    other = ca_file(trustme.CA(), tmp_path, "other-ca.pem")
    cli = Cli(tmp_path / "x", MELLAN_TOKEN=https_relay.owner_token)
    out = cli.run("whoami", "--relay", https_relay.url, "--ca-file", str(other), code=3)
    assert "certificate does not verify" in out.stderr
    assert "--ca-file" in out.stderr
    assert https_relay.owner_token not in out.stderr
    # no CA file at all: the public roots do not know the test CA either
    cli.run("whoami", "--relay", https_relay.url, code=3)
    with ReceiverClient(https_relay.url, "tok", ca_file=other) as rc, pytest.raises(
        ReceiverError, match="certificate does not verify"
    ):  # fmt: skip
        rc.claim(wait=0)
    send = Cli(tmp_path / "y", MELLAN_TOKEN="t", MELLAN_CA_FILE=str(other))
    out = send.run("send", "private/ops", "hi", "--relay", https_relay.url,
                   "--workspace", "default", code=3)  # fmt: skip
    assert "certificate does not verify" in out.stderr


def test_a_client_for_a_plain_http_relay_trusts_no_certificate(
    https_relay: RelayProc, ca: trustme.CA, tmp_path: Path
) -> None:
    """A plain-http relay's client gets TLS settings with no root at all (httpx would load
    the public ones for it): sent to an https URL anyway, it verifies nothing; the same
    request trusting the relay's CA goes through, so the refusal was the trust."""
    plain = https_relay.url.replace("https://", "http://")
    with (
        transport.client(plain, None, timeout=30) as c,
        pytest.raises(httpx.ConnectError, match="certificate verify failed"),
    ):
        c.get(https_relay.url + "/healthz")
    with verified(ca_file(ca, tmp_path)) as c:
        assert c.get(https_relay.url + "/healthz").status_code == 200
    # an https client without a CA file or a client certificate shares the public roots,
    # loaded once; one with a CA file has a context of its own
    shared = transport.ssl_context(transport.ClientTls())
    assert shared is transport.ssl_context(transport.ClientTls())
    assert shared.cert_store_stats()["x509_ca"] > 0
    own = transport.ssl_context(transport.ClientTls(ca_file=ca_file(ca, tmp_path)))
    assert own is not shared
    assert own.cert_store_stats()["x509_ca"] == 1


def test_sighup_reloads_for_new_connections_while_open_ones_keep_working(
    ca: trustme.CA, tmp_path: Path
) -> None:
    crt, key = server_pair(ca, tmp_path)
    relay = start_relay(f"sqlite://{tmp_path / 'relay.db'}", tmp_path,
                        "--tls-cert", str(crt), "--tls-key", str(key))  # fmt: skip
    try:
        old_ca = ca_file(ca, tmp_path, "old.pem")
        caller, receiver = setup_agents(relay, old_ca)
        # an open connection (a long-poll claim) made under the old certificate
        claimed: list[ClaimedTask] = []
        rc = ReceiverClient(relay.url, receiver, ca_file=old_ca)
        assert rc.claim(wait=0) == []  # the connection is open (pooled, kept alive)
        poll = threading.Thread(target=lambda: claimed.extend(rc.claim(wait=50)))
        poll.start()
        # replace the pair by one from another CA, then SIGHUP
        new_ca_obj = trustme.CA(organization_name="rotated CA")
        new_ca = ca_file(new_ca_obj, tmp_path, "new.pem")
        server_pair(new_ca_obj, tmp_path)  # overwrites relay.crt / relay.key
        mark = len(relay.lines)
        relay.proc.send_signal(signal.SIGHUP)
        wait_line(relay, "certificate reloaded", mark)
        # a new connection sees the new certificate: the old CA no longer verifies it
        with verified(new_ca, base_url=relay.url) as c:
            assert c.get("/healthz").status_code == 200
            with verified(old_ca, base_url=relay.url) as stale, pytest.raises(httpx.ConnectError):
                stale.get("/healthz")
            send = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "x"}]},
                    "metadata": {"capability": "incident.inspect"},
                    "configuration": {"returnImmediately": True}}  # fmt: skip
            auth = {"authorization": f"Bearer {caller}", "A2A-Version": "1.0"}
            r = c.post("/a2a/default/private/ops/message:send", json=send, headers=auth)
            assert r.status_code == 200, r.text
        # the long-poll on the connection opened before the reload gets the task
        poll.join(DEADLINE)
        assert not poll.is_alive()
        assert len(claimed) == 1
        assert claimed[0].task["id"] == r.json()["task"]["id"]
        rc.close()
        # a bad pair (key of another certificate) keeps the current one, and says why
        other_key = tmp_path / "other.key"
        new_ca_obj.issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other_key))
        other_key.replace(key)
        mark = len(relay.lines)
        relay.proc.send_signal(signal.SIGHUP)
        line = wait_line(relay, "certificate reload failed", mark)
        assert "still serving the previous one" in line
        with verified(new_ca, base_url=relay.url) as c:
            assert c.get("/healthz").status_code == 200
        assert relay.proc.poll() is None
    finally:
        relay.stop()


def test_receiver_api_requires_a_client_certificate_with_client_ca(
    ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crt, key = server_pair(ca, tmp_path)
    receivers = trustme.CA(organization_name="receivers CA")
    client_ca = ca_file(receivers, tmp_path, "receivers-ca.pem")
    relay = start_relay(f"sqlite://{tmp_path / 'relay.db'}", tmp_path, "--tls-cert", str(crt),
                        "--tls-key", str(key), "--client-ca", str(client_ca))  # fmt: skip
    try:
        cafile = ca_file(ca, tmp_path)
        _caller, token = setup_agents(relay, cafile)  # the control API needs no certificate
        with ReceiverClient(relay.url, token, ca_file=cafile) as rc:
            with pytest.raises(ReceiverError) as err:
                rc.claim(wait=0)
            assert err.value.status == 403
            assert err.value.code == "client-certificate-required"
            assert "client certificate" in err.value.reason
        # a certificate the receivers' CA signed, from the environment
        mine = receivers.issue_cert("private-ops.receivers.example", common_name="private/ops")
        cert, ckey = tmp_path / "ops.crt", tmp_path / "ops.key"
        mine.cert_chain_pems[0].write_to_path(str(cert))
        mine.private_key_pem.write_to_path(str(ckey))
        monkeypatch.setenv("MELLAN_CLIENT_CERT", str(cert))
        monkeypatch.setenv("MELLAN_CLIENT_KEY", str(ckey))
        with ReceiverClient(relay.url, token, ca_file=cafile) as rc:
            assert rc.claim(wait=0) == []
        # one signed by another CA fails the handshake itself
        stranger = trustme.CA().issue_cert("x.example")
        stranger.cert_chain_pems[0].write_to_path(str(cert))
        stranger.private_key_pem.write_to_path(str(ckey))
        with ReceiverClient(relay.url, token, ca_file=cafile) as rc, pytest.raises(ReceiverError):
            rc.claim(wait=0)
    finally:
        relay.stop()


def test_bad_tls_settings_are_refused_at_start(tmp_path: Path, ca: trustme.CA) -> None:
    crt, _key = server_pair(ca, tmp_path)
    cli = Cli(tmp_path)
    db = f"sqlite://{tmp_path / 'r.db'}"
    out = cli.run("relay", "--database", db, "--tls-cert", str(crt), code=2)
    assert "--tls-cert and --tls-key go together" in out.stderr
    out = cli.run("relay", "--database", db, "--tls-cert", str(crt), "--tls-key", str(crt), code=1)
    assert "cannot serve HTTPS" in out.stderr
    out = cli.run("relay", "--database", db, "--client-ca", str(crt), code=2)
    assert "needs HTTPS" in out.stderr


# -- no credential over plain HTTP to another machine ---------------------------------------


def test_plain_http_credentials_are_refused_for_a_non_loopback_url(tmp_path: Path) -> None:
    far = "http://192.0.2.10:8787"  # TEST-NET-1: nothing is sent, so nothing need listen
    cli = Cli(tmp_path, MELLAN_TOKEN="secret-token")
    for args in (("whoami", "--relay", far),
                 ("send", "private/ops", "hi", "--relay", far, "--workspace", "default"),
                 ("join", "CODE", "--relay", far)):  # fmt: skip
        out = cli.run(*args, code=2)
        assert "refusing to send a credential over plain HTTP to 192.0.2.10" in out.stderr
        assert "secret-token" not in out.stderr
    with pytest.raises(ReceiverError, match=r"over plain HTTP to relay\.example\.net"):
        ReceiverClient("http://relay.example.net", "tok")
    from melchior.integrations.relay_caller import Credential, RelayCaller

    with pytest.raises(transport.TransportError, match="plain HTTP"):
        RelayCaller(Credential("http://10.1.2.3:8787", "tok", "default"))


@given(st.ip_addresses(v=4))
def test_the_plain_http_rule_is_loopback_or_nothing(ip: Any) -> None:
    url = f"http://{ip}:8787"
    if ip.is_loopback:
        transport.check_url(url, credential=True)
    else:
        with pytest.raises(transport.TransportError, match="plain HTTP"):
            transport.check_url(url, credential=True)
    transport.check_url(url, credential=False)  # no credential: nothing to protect
    transport.check_url(f"https://{ip}:8787", credential=True)


def test_client_tls_precedence(tmp_path: Path) -> None:
    stored = {"ca_file": "/stored.pem"}
    assert transport.client_tls(None, stored, {}).ca_file == Path("/stored.pem")
    env = {"MELLAN_CA_FILE": "/env.pem"}
    assert transport.client_tls(None, stored, env).ca_file == Path("/env.pem")
    assert transport.client_tls("/flag.pem", stored, env).ca_file == Path("/flag.pem")
    with pytest.raises(transport.TransportError, match="MELLAN_CLIENT_CERT"):
        transport.client_tls(None, None, {"MELLAN_CLIENT_KEY": "/k.pem"})
    with pytest.raises(transport.TransportError, match="does not exist"):
        transport.ssl_context(transport.ClientTls(ca_file=tmp_path / "missing.pem"))


def test_sighup_does_not_stop_a_plain_http_relay(tmp_path: Path) -> None:
    """A unit's ExecReload sends SIGHUP whatever the relay serves; it must not kill it."""
    relay = start_relay(f"sqlite://{tmp_path / 'relay.db'}", tmp_path)
    try:
        mark = len(relay.lines)
        relay.proc.send_signal(signal.SIGHUP)
        wait_line(relay, "SIGHUP: nothing to reload", mark)
        with relay.client() as c:
            assert c.get("/healthz").status_code == 200
    finally:
        assert relay.stop() == 0


def test_accepted_connections_have_nodelay() -> None:
    """The relay's listening socket says TCP, so asyncio sets TCP_NODELAY on each accepted
    connection; without it every keep-alive response waited out the client's delayed ACK
    between its head and its body (~40 ms a request)."""
    import asyncio
    import socket

    from melchior.mellan.relay.server.serve import bind

    async def main() -> int:
        got: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def accepted(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            sock = w.get_extra_info("socket")
            got.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            w.close()

        sock = bind("127.0.0.1", 0)
        server = await asyncio.start_server(accepted, sock=sock)
        async with server:
            _r, w = await asyncio.open_connection(*sock.getsockname())
            value = await asyncio.wait_for(got, DEADLINE)
            w.close()
            return value

    assert asyncio.run(main()) != 0


def test_the_mcp_bridges_relay_caller_verifies_too(
    https_relay: RelayProc, ca: trustme.CA, tmp_path: Path
) -> None:
    import asyncio

    from melchior.integrations.relay_caller import Credential, RelayCaller, RelayRefused

    cafile = ca_file(ca, tmp_path)
    other = ca_file(trustme.CA(), tmp_path, "other.pem")

    async def whoami(tls: transport.ClientTls) -> dict[str, Any]:
        caller = RelayCaller(Credential(https_relay.url, https_relay.owner_token, None, tls))
        try:
            return await caller.me()
        finally:
            await caller.close()

    assert asyncio.run(whoami(transport.ClientTls(ca_file=cafile)))["kind"] == "owner"
    with pytest.raises(RelayRefused, match="certificate verify failed"):
        asyncio.run(whoami(transport.ClientTls(ca_file=other)))
