"""Helpers for the tests of shared task streams (tests/relay/test_stream_fanout.py and
test_stream_sharing.py): a task queued through the real A2A entry, a sample read off the
relay's own ``/metrics`` (streams are judged by what the relay counts, never by timing),
and a hang guard for conditions that must come true."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from a2a_kit import CAPS, Server, World, message

H = {"A2A-Version": "1.0", "Content-Type": "application/json"}


POLL = 10.0
"""Long, so the reads counted are those the changes caused (a poll would add one per
reader, or one per stream before the readers were shared)."""


def queued_task(server: Server, world: World) -> str:
    body = {
        "message": message("hello", metadata={"capability": CAPS[0]}),
        "configuration": {"returnImmediately": True},
    }
    auth = {"Authorization": f"Bearer {world.tokens['caller']}"}
    r = httpx.post(f"{server.base()}/message:send", json=body, headers={**H, **auth})
    assert r.status_code == 200, r.text
    return str(r.json()["task"]["id"])


def metric(server: Server, world: World, name: str, **labels: str) -> float:
    auth = {"Authorization": f"Bearer {world.tokens['owner']}"}
    r = httpx.get(f"{server.url}/metrics", headers=auth)
    assert r.status_code == 200, r.text
    want = tuple(sorted(labels.items()))
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name == name and tuple(sorted(s.labels.items())) == want:
                return float(s.value)
    return 0.0


def eventually(check: Callable[[], bool], what: str) -> None:
    """Until ``check`` holds (a hang guard, not a latency threshold)."""
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
