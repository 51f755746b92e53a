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

CLIENT = r"""
import {
  ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory, RestTransportFactory,
} from '@a2a-js/sdk/client';
const [base, token, binding, ...rest] = process.argv.slice(2);
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
"""
"""The JS client of both probes: the card's URL, a bearer token and the binding to prefer
from the command line (then the probe's own arguments, in ``rest``)."""

PROBE = (
    CLIENT
    + r"""
import { randomUUID } from 'node:crypto';
import { Role, taskStateToJSON } from '@a2a-js/sdk';
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
)


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


PUSH_PROBE = (
    CLIENT
    + r"""
import { randomUUID } from 'node:crypto';
import { Role } from '@a2a-js/sdk';
const [hook] = rest;
const config = (id, url, auth) => ({ tenant: '', id, taskId: '', url, token: 'tok-js',
                                     authentication: auth });
const sent = await client.sendMessage({
  tenant: '', metadata: undefined,
  message: { messageId: randomUUID(), role: Role.ROLE_USER, taskId: '', contextId: '',
             parts: [{ content: { $case: 'text', value: 'echo js' }, metadata: undefined,
                       filename: '', mediaType: 'text/plain' }],
             extensions: [], metadata: undefined, referenceTaskIds: [] },
  configuration: { acceptedOutputModes: [], historyLength: undefined, returnImmediately: true,
                   taskPushNotificationConfig: config('first', hook,
                     { scheme: 'Bearer', credentials: 'js-secret' }) },
});
const taskId = sent.id;
const out = { taskId };
const made = await client.createTaskPushNotificationConfig(
  { ...config('second', hook + '?2', undefined), taskId });
out.made = made.id;
const got = await client.getTaskPushNotificationConfig({ tenant: '', taskId, id: 'second' });
out.gotUrl = got.url;
const listed = await client.listTaskPushNotificationConfig(
  { tenant: '', taskId, pageSize: 0, pageToken: '' });
out.listed = listed.configs.map((c) => [c.id, c.authentication?.scheme ?? '',
                                        c.authentication?.credentials ?? '']);
await client.deleteTaskPushNotificationConfig({ tenant: '', taskId, id: 'second' });
const after = await client.listTaskPushNotificationConfig(
  { tenant: '', taskId, pageSize: 0, pageToken: '' });
out.after = after.configs.map((c) => c.id);
console.log(JSON.stringify(out));
"""
)


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
def test_js_client_push_configs_and_deliveries(tmp_path: Path, binding: str) -> None:
    """The JS client's four push-config calls and a config given with the send, both
    bindings; the webhook hears the task to its end with the config's authentication."""
    from a2a_kit import WS
    from webhook_kit import Hook, ended, states

    script = Path(SDK_DIR) / f"melchior-a2a-push-{os.getpid()}.mjs"
    script.write_text(PUSH_PROBE)
    hook = Hook()
    try:
        with running(f"sqlite://{tmp_path / 'r.db'}", push={"poll": 0.05}) as (server, world, _):
            server.store.set_push_allow_private(WS, True)
            proc = subprocess.run(
                ["node", script.name, server.base() + "/", world.tokens["caller"], binding,
                 hook.url],
                cwd=SDK_DIR, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            first = [r for r in hook.wait_for(lambda s: ended([r for r in s if "?2" not in r.path]))
                     if "?2" not in r.path]  # fmt: skip
    finally:
        script.unlink()
        hook.close()
    out = json.loads(proc.stdout)
    assert (out["made"], out["gotUrl"]) == ("second", hook.url + "?2")
    assert out["listed"] == [["first", "Bearer", ""], ["second", "", ""]]  # credentials withheld
    assert out["after"] == ["first"]
    assert states(first)[0] == "TASK_STATE_SUBMITTED"
    assert states(first)[-1] == "TASK_STATE_COMPLETED"
    assert all(r.headers["authorization"] == "Bearer js-secret" for r in first)
    assert all(r.headers["x-a2a-notification-token"] == "tok-js" for r in first)
