"""No JSON body of bounded size makes any route of the relay answer 5xx.

Hypothesis writes JSON *text* — so numbers come in every spelling (``1e1000000``, ``-0``,
``1E-400``, thirty digits), strings with lone-surrogate escapes, and nesting past the
limit — shaped like each route's request (its own field names with hostile values) or
not shaped at all, and posts it over real HTTP to a real relay with real credentials.
Every answer must be a refusal or a success, never a server error: a 5xx here is a
request that reached something unbounded or unguarded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from a2a_kit import Server, World, running

NUMBERS = st.one_of(
    st.sampled_from(
        [
            *("1e1000000", "-1e1000000", "1e-1000000", "1E+400", "-0", "0.0", "1.5"),
            *("1e100000000000", "9" * 30, "-" + "9" * 4000, "4611686018427387904"),
            "123456789012345678901234567890.5",
        ]
    ),
    st.integers().map(str),
    st.from_regex(r"-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,25})?([eE][+-]?[0-9]{1,12})?", fullmatch=True),
)
STRINGS = st.one_of(
    st.text(max_size=40).map(lambda s: json.dumps(s, ensure_ascii=False)),
    st.sampled_from(['"\\ud800"', '"a\\udfffb"', '"\\udc00\\ud800"', '"²"', '"\\u0000"', '""']),
    st.integers(min_value=0, max_value=300).map(lambda n: json.dumps("x" * n)),
)
SCALARS = st.one_of(NUMBERS, STRINGS, st.sampled_from(["true", "false", "null"]))


def _obj(items: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"


VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.lists(st.tuples(STRINGS, inner), max_size=4).map(_obj),
    ),
    max_leaves=12,
)
DEEP = st.integers(min_value=90, max_value=3000).map(lambda n: "[" * n + "]" * n)


def shaped(fields: tuple[str, ...], extra: dict[str, str] | None = None) -> st.SearchStrategy[str]:
    """An object using the route's own field names, each with a hostile value."""
    names = st.sampled_from(fields).map(json.dumps)
    pairs = st.lists(st.tuples(names | STRINGS, VALUES | DEEP), max_size=5)
    return pairs.map(lambda items: _obj(items + sorted((extra or {}).items())))


MESSAGE = st.builds(
    lambda mid, text, ctx, parts: _obj(
        [
            ('"messageId"', mid),
            ('"role"', '"ROLE_USER"'),
            ('"parts"', parts if parts is not None else f'[{{"text":{text}}}]'),
            *([('"contextId"', ctx)] if ctx is not None else []),
        ]
    ),
    STRINGS,
    STRINGS,
    st.none() | STRINGS | NUMBERS,
    st.none() | VALUES,
)


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, World]]:
    db = tmp_path_factory.mktemp("fuzz") / "relay.db"
    with running(f"sqlite://{db}", receiver=False) as (server, world, _):
        yield server, world


def routes(world: World, task_id: str) -> list[tuple[str, str, str, st.SearchStrategy[str]]]:
    """(token name, method, path, body strategy) for every route that reads a body."""
    base = "/a2a/acme/private/ops"
    params = shaped(
        ("id", "historyLength", "pageSize", "pageToken", "contextId", "status", "message"),
    )
    send = st.builds(
        lambda m, h: _obj(
            [
                ('"message"', m),
                ('"configuration"', f'{{"returnImmediately":true,"historyLength":{h}}}'),
            ]
        ),
        MESSAGE,
        NUMBERS,
    )
    rpc = st.builds(
        lambda method, p: f'{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{p}}}',
        st.sampled_from(["GetTask", "ListTasks", "CancelTask", "GetExtendedAgentCard"]),
        params | st.just(f'{{"id":"{task_id}"}}'),
    ) | send.map(lambda p: f'{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{p}}}')
    fenced = ("epoch", "lease_seconds", "kind", "body", "result", "error", "retryable")
    tasks = f"/api/receiver/tasks/{task_id}"
    return [
        ("owner", "POST", "/api/agents", shaped(("id", "description", "capabilities"))),
        ("owner", "POST", "/api/enrollments", shaped(("agent", "ttl_seconds"))),
        ("owner", "POST", "/api/grants", shaped(("caller", "receiver", "capabilities"))),
        ("owner", "POST", f"/api/tasks/{task_id}/cancel", VALUES),
        ("none", "POST", "/api/join", shaped(("code",))),
        # wait is pinned to 0 so a valid long-poll does not hold the test
        (
            "receiver",
            "POST",
            "/api/receiver/claim",
            shaped(("limit", "lease_seconds", "worker"), {'"wait"': "0"}),
        ),
        ("receiver", "POST", f"{tasks}/renew", shaped(fenced)),
        ("receiver", "POST", f"{tasks}/progress", shaped(fenced)),
        ("receiver", "POST", f"{tasks}/complete", shaped((*fenced, "input_required"))),
        ("receiver", "POST", f"{tasks}/fail", shaped((*fenced, "retry_after"))),
        ("receiver", "POST", f"{tasks}/cancel-ack", shaped(fenced)),
        ("caller", "POST", base, rpc | VALUES | DEEP),
        ("caller", "POST", f"{base}/message:send", send | VALUES),
        ("caller", "POST", f"{base}/tasks/{task_id}:cancel", VALUES),
    ]


@settings(max_examples=250, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_json_body_yields_a_5xx_from_any_route(
    relay: tuple[Server, World], data: st.DataObject
) -> None:
    server, world = relay
    task = server.store.list_tasks("acme", limit=1)
    task_id = task[0].id if task else "no-such-task"
    who, method, path, bodies = data.draw(st.sampled_from(routes(world, task_id)), label="route")
    text = data.draw(bodies, label="body")
    headers = {"content-type": "application/json", "A2A-Version": "1.0"}
    if who != "none":
        headers["authorization"] = f"Bearer {world.tokens[who]}"
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.request(method, path, content=text.encode("utf-8", "surrogatepass"), headers=headers)
    assert r.status_code < 500, (path, text[:300], r.text[:500])
    if r.status_code == 200 and path.endswith("/a2a/acme/private/ops"):
        reply: dict[str, Any] = r.json()
        error = reply.get("error")
        assert error is None or error["code"] != -32603, (text[:300], reply)
