"""Interop with a second, independent client: @a2a-js/sdk 1.3 under Node, both bindings.

Runs when ``A2A_JS_SDK_DIR`` names a directory holding ``node_modules/@a2a-js/sdk``
(``npm i @a2a-js/sdk@1.3.0`` there) and ``node`` is on PATH; skipped otherwise. The same
real relay and receiver loop as the Python interop suite serve the tasks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from a2a_kit import CAPS, running

SDK_DIR = os.environ.get("A2A_JS_SDK_DIR", "")
pytestmark = pytest.mark.skipif(
    not (
        SDK_DIR and (Path(SDK_DIR) / "node_modules/@a2a-js/sdk").is_dir() and shutil.which("node")
    ),
    reason="set A2A_JS_SDK_DIR to a directory with node_modules/@a2a-js/sdk (and have node)",
)

PROBE = r"""
import { randomUUID } from 'node:crypto';
import { Role, taskStateToJSON } from '@a2a-js/sdk';
import {
  ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory, RestTransportFactory,
} from '@a2a-js/sdk/client';
const [base, token, binding] = process.argv.slice(2);
const fetchImpl = (url, init = {}) => {
  const headers = new Headers(init.headers || {});
  headers.set('Authorization', `Bearer ${token}`);
  return fetch(url, { ...init, headers });
};
const factory = new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
  transports: [new JsonRpcTransportFactory({ fetchImpl }), new RestTransportFactory({ fetchImpl })],
  preferredTransports: [binding],
}));
const client = await factory.createFromUrl(base);
const msg = (text) => ({
  messageId: randomUUID(), role: Role.ROLE_USER, taskId: '', contextId: '',
  parts: [{ content: { $case: 'text', value: text }, metadata: undefined, filename: '',
            mediaType: 'text/plain' }],
  extensions: [], metadata: undefined, referenceTaskIds: [],
});
const send = (text, configuration) =>
  ({ tenant: '', message: msg(text), configuration, metadata: undefined });
const out = {};
const card = await client.getAgentCard();
out.skills = card.skills.map((s) => s.id);
const res = await client.sendMessage(send('echo js', undefined));
out.sendState = taskStateToJSON(res.status.state);
out.reply = res.status.message.parts[0].content.value;
const got = await client.getTask({ tenant: '', id: res.id, historyLength: undefined });
out.getState = taskStateToJSON(got.status.state);
out.stream = [];
for await (const ev of client.sendMessageStream(send('steps 2', undefined))) {
  out.stream.push(ev.payload?.$case);
}
const bg = await client.sendMessage(send('hold', {
  acceptedOutputModes: [], taskPushNotificationConfig: undefined, historyLength: undefined,
  returnImmediately: true,
}));
const canceled = await client.cancelTask({ tenant: '', id: bg.id, metadata: undefined });
out.cancelState = taskStateToJSON(canceled.status.state);
try {
  await client.getTask({ tenant: '', id: 'no-such-task', historyLength: undefined });
  out.notFound = 'no error';
} catch (e) {
  out.notFound = e.constructor.name;
}
console.log(JSON.stringify(out));
"""


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
def test_js_client_send_get_stream_cancel_card_errors(tmp_path: Path, binding: str) -> None:
    script = Path(SDK_DIR) / f"melchior-a2a-probe-{os.getpid()}.mjs"
    script.write_text(PROBE)
    try:
        with running(f"sqlite://{tmp_path / 'r.db'}") as (server, world, _):
            # the JS client resolves the card path relative to the URL: keep the final slash
            proc = subprocess.run(
                ["node", script.name, server.base() + "/", world.tokens["caller"], binding],
                cwd=SDK_DIR, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
    finally:
        script.unlink()
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["skills"] == [CAPS[0]]
    assert (out["sendState"], out["reply"]) == ("TASK_STATE_COMPLETED", "echo: js")
    assert out["getState"] == "TASK_STATE_COMPLETED"
    assert out["stream"][0] == "task"
    assert out["stream"][-1] == "statusUpdate"
    assert "artifactUpdate" in out["stream"]
    assert out["cancelState"] == "TASK_STATE_CANCELED"
    assert out["notFound"].endswith("TaskNotFoundError")
