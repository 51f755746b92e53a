"""Interop over gRPC with a second, independent client: @a2a-js/sdk 1.3's gRPC transport
(on @grpc/grpc-js) under Node — send, stream, cancel and an error's details.

Runs when ``A2A_JS_SDK_DIR`` names a directory holding ``node_modules/@a2a-js/sdk`` and
``node_modules/@grpc/grpc-js`` (``make js-sdk`` installs both) and ``node`` is on PATH;
skipped otherwise. The same real relay and receiver loop as the Python suites serve
the tasks; the client finds the gRPC target and tenant on the agent card.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from a2a_kit import CAPS, running
from conftest import ON_CI

SDK_DIR = os.environ.get("A2A_JS_SDK_DIR", "")
MISSING = not (
    SDK_DIR
    and (Path(SDK_DIR) / "node_modules/@a2a-js/sdk").is_dir()
    and (Path(SDK_DIR) / "node_modules/@grpc/grpc-js").is_dir()
    and shutil.which("node")
)
WHY = "set A2A_JS_SDK_DIR to a directory with @a2a-js/sdk and @grpc/grpc-js (make js-sdk)"


@pytest.fixture(autouse=True)
def js_sdk() -> None:
    """Skipped where the JS stack is missing, except on CI (``make test`` installs it)."""
    if MISSING:
        if ON_CI:
            pytest.fail(f"the JS gRPC client is required on CI: {WHY}")
        pytest.skip(WHY)


PROBE = r"""
import { randomUUID } from 'node:crypto';
import { ClientFactory, ClientFactoryOptions } from '@a2a-js/sdk/client';
import { GrpcTransportFactory } from '@a2a-js/sdk/client/grpc';
import { Role, taskStateToJSON } from '@a2a-js/sdk';
const [base, token] = process.argv.slice(2);
const factory = new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
  transports: [new GrpcTransportFactory()],
  preferredTransports: ['GRPC'],
}));
const client = await factory.createFromUrl(base);
const auth = { serviceParameters: { authorization: `Bearer ${token}` } };
const card = await client.getAgentCard(auth);  // the extended card, over gRPC
const tenant = card.supportedInterfaces.find((i) => i.protocolBinding === 'GRPC').tenant;
const msg = (text) => ({
  messageId: randomUUID(), role: Role.ROLE_USER, taskId: '', contextId: '',
  parts: [{ content: { $case: 'text', value: text }, metadata: undefined, filename: '',
            mediaType: 'text/plain' }],
  extensions: [], metadata: { capability: 'incident.inspect' }, referenceTaskIds: [],
});
const send = (text, configuration) =>
  ({ tenant, message: msg(text), configuration, metadata: undefined });
const out = { tenant, skills: card.skills.map((s) => s.id) };
const res = await client.sendMessage(send('echo grpc-js', undefined), auth);
out.sendState = taskStateToJSON(res.status.state);
out.artifact = res.artifacts[0].parts[0].content.value;
out.stream = [];
for await (const ev of client.sendMessageStream(send('steps 2', undefined), auth)) {
  out.stream.push(ev.payload?.$case ?? ev.kind ?? 'unknown');
}
const bg = await client.sendMessage(send('hold', {
  acceptedOutputModes: [], taskPushNotificationConfig: undefined, historyLength: undefined,
  returnImmediately: true,
}), auth);
const canceled = await client.cancelTask({ tenant, id: bg.id, metadata: undefined }, auth);
out.cancelState = taskStateToJSON(canceled.status.state);
try {
  await client.getTask({ tenant, id: 'no-such-task', historyLength: undefined }, auth);
  out.notFound = 'no error';
} catch (e) {
  out.notFound = e.constructor.name;
}
console.log(JSON.stringify(out));
process.exit(0);  // grpc-js keeps its channel open otherwise
"""


def test_js_grpc_client_send_stream_cancel_errors(tmp_path: Path) -> None:
    script = Path(SDK_DIR) / f"melchior-a2a-grpc-probe-{os.getpid()}.mjs"
    script.write_text(PROBE)
    try:
        with running(f"sqlite://{tmp_path / 'r.db'}", grpc=True) as (server, world, _):
            proc = subprocess.run(
                ["node", script.name, server.base() + "/", world.tokens["caller"]],
                cwd=SDK_DIR, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
    finally:
        script.unlink()
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["tenant"] == "acme/private/ops"
    assert out["skills"] == [CAPS[0]]
    assert (out["sendState"], out["artifact"]) == ("TASK_STATE_COMPLETED", "echo: grpc-js")
    assert out["stream"][0] == "task"
    assert out["stream"][-1] == "statusUpdate"
    assert out["stream"].count("artifactUpdate") == 2
    assert out["cancelState"] == "TASK_STATE_CANCELED"
    assert out["notFound"].endswith("TaskNotFoundError")
