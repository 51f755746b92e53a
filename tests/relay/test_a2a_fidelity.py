"""Payload fidelity end to end: any JSON a caller puts in parts and metadata reaches the
receiver (through the receiver API) and comes back in the task exactly — same numbers,
same digits — over a real relay."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from a2a_kit import Receiver, Server, World, running
from melchior.mellan.relay.surfaces.a2a import jsontext

numbers = st.integers(min_value=-(10**30), max_value=10**30) | st.decimals(
    allow_nan=False, allow_infinity=False
).filter(lambda d: d.is_finite())
scalars = st.none() | st.booleans() | numbers | st.text(max_size=20)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, World, Receiver]]:
    db = tmp_path_factory.mktemp("a2a-fidelity") / "relay.db"
    with running(f"sqlite://{db}") as (server, world, rx):
        assert rx is not None
        yield server, world, rx


def exact(text: str) -> Any:
    return json.loads(text, parse_float=Decimal)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=values, meta=st.dictionaries(st.text(max_size=8), values, max_size=3))
def test_any_json_round_trips_through_relay_and_receiver(
    relay: tuple[Server, World, Receiver], data: Any, meta: dict[str, Any]
) -> None:
    server, world, _ = relay
    message = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"text": "mirror"}, {"data": data, "metadata": meta}],
        "metadata": meta,
    }
    body = jsontext.dumpb({"message": message})
    r = httpx.post(
        f"{server.base()}/message:send",
        content=body,
        headers={
            "A2A-Version": "1.0",
            "Authorization": f"Bearer {world.tokens['caller']}",
            "Content-Type": "application/json",
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    task = exact(r.text)["task"]
    sent = exact(body.decode())["message"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    mirrored = task["artifacts"][0]
    assert mirrored["parts"] == sent["parts"]  # through the receiver API and back
    assert mirrored["metadata"] == sent["metadata"]
    assert task["history"][0]["parts"] == sent["parts"]
    # and the digits themselves, not just equal values
    assert jsontext.dumps(mirrored["parts"]) == jsontext.dumps(sent["parts"])
