"""The receiver over HTTPS with a client certificate (mTLS), certificates made in the test:
a relay that requires one on the receiver API serves a receiver presenting it (its
``[tls]`` table), and the receiver refuses, before it starts, to send its credential over
plain HTTP to another machine."""

from __future__ import annotations

from pathlib import Path

import trustme

from receiver_kit import (
    make_net,
    receiving,
    result_text,
    start_receiver,
    worker_route,
    write_config,
)
from relay_proc import start_relay
from tls_kit import ca_file, server_pair


def test_a_receiver_presents_its_certificate_to_a_relay_that_requires_one(
    tmp_path: Path,
) -> None:
    relays = trustme.CA(organization_name="relays CA")
    receivers = trustme.CA(organization_name="receivers CA")
    crt, key = server_pair(relays, tmp_path)
    relay = start_relay(
        f"sqlite://{tmp_path / 'relay.db'}", tmp_path, "--tls-cert", str(crt), "--tls-key",
        str(key), "--client-ca", str(ca_file(receivers, tmp_path, "receivers-ca.pem")),
    )  # fmt: skip
    relay.ca = ca_file(relays, tmp_path)
    try:
        assert relay.url.startswith("https://")
        net = make_net(relay, tmp_path)
        work = tmp_path / "work"
        work.mkdir()
        mine = receivers.issue_cert("ops.receivers.example", common_name="private/ops")
        cert, ckey = tmp_path / "ops.crt", tmp_path / "ops.key"
        mine.cert_chain_pems[0].write_to_path(str(cert))
        mine.private_key_pem.write_to_path(str(ckey))
        tls = f'[tls]\nca = "{relay.ca}"\ncert = "{cert}"\nkey = "{ckey}"\n'
        config = write_config(tmp_path / "receiver.toml", net, work, extra=tls)
        worker_route(net, work, tmp_path / "worker.py")
        with receiving(net, config) as rp:
            task_id = net.send("over tls")
            view = net.settled(task_id)
            assert view["state"] == "succeeded", (view["error"], rp.lines)
            assert result_text(view) == "done: OVER TLS (turn 1)"
        # without a certificate the relay refuses its claims: it stops and says why
        bare = write_config(tmp_path / "bare.toml", net, work, extra=f'[tls]\nca = "{relay.ca}"\n')
        rp = start_receiver(net, bare)
        assert rp.finish() == 78, rp.lines
        assert any("client certificate" in line for line in rp.lines), rp.lines
    finally:
        relay.stop()


def test_plain_http_to_another_machine_is_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    relay = start_relay(f"sqlite://{tmp_path / 'relay.db'}", tmp_path)
    try:
        net = make_net(relay, tmp_path)
        work = tmp_path / "work"
        work.mkdir()
        config = write_config(tmp_path / "receiver.toml", net, work)
        text = config.read_text().replace(relay.url, "http://192.0.2.10:8787")
        config.write_text(text)
        rp = start_receiver(net, config)
        code = rp.finish()
        assert code == 78, rp.lines  # EX_CONFIG: not restarted by its unit
        said = "\n".join(rp.lines)
        assert "refusing to send a credential over plain HTTP to 192.0.2.10" in said
    finally:
        relay.stop()
