"""The receiver against an HTTPS relay that requires client certificates on the receiver
API (mTLS), with certificate authorities made in the test (trustme): it verifies the
relay with its configured CA, presents its certificate, and runs the task; without a
certificate it stops at once and says why."""

from __future__ import annotations

import sys
from pathlib import Path

import trustme

from receiver_kit import WORKER, ReceiverProc, result_text, start_receiver, wait_for
from relay_proc import RelayProc, start_relay
from test_relay_tls import ca_file, server_pair, setup_agents, verified


def write(path: Path, relay: RelayProc, work: Path, tls: str) -> Path:
    path.write_text(
        f'relay = "{relay.url}"\ntoken_env = "RECEIVER_TOKEN"\nwait = 5\n'
        f'state_dir = "{path.parent / "state"}"\n'
        f'[allow]\nadapters = ["command"]\ncwd = ["{work}"]\nprograms = ["{sys.executable}"]\n'
        f"[tls]\n{tls}"
    )
    return path


def test_mtls_receiver_runs_a_task_and_without_a_certificate_stops(tmp_path: Path) -> None:
    ca = trustme.CA(organization_name="relay CA")
    receivers = trustme.CA(organization_name="receivers CA")
    crt, key = server_pair(ca, tmp_path)
    relay = start_relay(
        f"sqlite://{tmp_path / 'relay.db'}", tmp_path, "--tls-cert", str(crt),
        "--tls-key", str(key), "--client-ca", str(ca_file(receivers, tmp_path, "rx-ca.pem")),
    )  # fmt: skip
    try:
        cafile = ca_file(ca, tmp_path)
        caller, receiver = setup_agents(relay, cafile)
        work = tmp_path / "work"
        work.mkdir()
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        owner = {"authorization": f"Bearer {relay.owner_token}"}
        with verified(cafile, base_url=relay.url) as c:
            route = {"capability": "incident.inspect", "adapter": "command", "cwd": str(work),
                     "options": {"argv": [sys.executable, str(script)]}}  # fmt: skip
            rid = c.post(
                "/api/routes", json=route, headers={"authorization": f"Bearer {receiver}"}
            ).json()["id"]
            assert c.post(f"/api/routes/{rid}/approve", headers=owner).status_code == 200
        mine = receivers.issue_cert("ops.receivers.example", common_name="private/ops")
        cert, ckey = tmp_path / "ops.crt", tmp_path / "ops.key"
        mine.cert_chain_pems[0].write_to_path(str(cert))
        mine.private_key_pem.write_to_path(str(ckey))

        class Net:  # what start_receiver needs of a network
            def __init__(self) -> None:
                self.relay = relay
                self.receiver_token = receiver

        # without a client certificate: refused on the receiver API, stops and says why
        bare = write(tmp_path / "bare.toml", relay, work, f'ca = "{cafile}"\n')
        rp: ReceiverProc = start_receiver(Net(), bare)  # type: ignore[arg-type]
        assert rp.finish() == 78
        assert any("client certificate" in line for line in rp.lines), rp.lines

        config = write(
            tmp_path / "receiver.toml", relay, work,
            f'ca = "{cafile}"\ncert = "{cert}"\nkey = "{ckey}"\n',
        )  # fmt: skip
        rp = start_receiver(Net(), config)  # type: ignore[arg-type]
        try:
            body = {
                "message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
                "metadata": {"capability": "incident.inspect"},
                "configuration": {"returnImmediately": True},
            }
            with verified(cafile, base_url=relay.url) as c:
                sent = c.post(
                    "/a2a/default/private/ops/message:send", json=body,
                    headers={"authorization": f"Bearer {caller}", "A2A-Version": "1.0"},
                )  # fmt: skip
                assert sent.status_code == 200, sent.text
                task_id = sent.json()["task"]["id"]

                def done() -> dict[str, object] | None:
                    view = c.get(f"/api/tasks/{task_id}", headers=owner).json()
                    return view if view["state"] not in ("queued", "leased") else None

                view = wait_for(done, "the task to settle")
            assert view["state"] == "succeeded", (view, rp.lines)
            assert result_text(view) == "done: HI (turn 1)"
        finally:
            rp.stop()
    finally:
        relay.stop()
