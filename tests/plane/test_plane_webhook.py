"""The webhook: lines from outside on loopback with a bearer token, at stranger trust.

An ``@NAME`` or a ``/team`` in a webhook body opens nothing — a stranger typing one —
while the same words typed by the operator would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from melchior.plane.runner import Plane
from melchior.plane.webhook import MAX_BODY, Webhook
from melchior.policy.fence import unfence
from plane_kit import load_plane, log, run, running, settle, turns, write_plane

TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@contextlib.asynccontextmanager
async def hooked(plane: Plane) -> AsyncIterator[httpx.AsyncClient]:
    hook = Webhook(plane, TOKEN)
    task = asyncio.create_task(hook.serve())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{hook.port}") as client:
            for _ in range(200):  # until it answers (a hang guard)
                with contextlib.suppress(httpx.TransportError):
                    await client.post("/agents/planner/lines")
                    break
                await asyncio.sleep(0.05)
            yield client
    finally:
        hook.stop()
        await task


def test_a_webhook_line_wakes_the_agent_fenced_and_its_at_and_team_are_inert(
    tmp_path: Path,
) -> None:
    config = load_plane(write_plane(tmp_path, [{"id": "planner"}, {"id": "ledger"}]))

    async def main() -> None:
        async with running(config) as (plane, watch), hooked(plane) as client:
            r = await client.post("/agents/planner/lines", content="/team ledger", headers=AUTH)
            assert r.status_code == 202
            assert r.json()["agent"] == "planner"
            r = await client.post(
                "/agents/planner/lines",
                json={"text": "ask @ledger now\nsend ledger: from outside\nanswer: seen"},
                headers=AUTH,
            )
            assert r.status_code == 202
            await settle(plane)
            assert plane.state.opened("planner") == set()
            assert [e["receipt"] for e in log(plane, "note")] == ["held"]
            assert turns(config, "ledger") == []
            assert [e["kind"] for e in log(plane) if e["kind"] in ("webhook", "answer")] == [
                "webhook",
                "webhook",
            ]  # the webhook's answer wakes nobody
            assert watch.of("planner", "question")
            # the operator typing the same words does open the door for that turn
            plane.operator_line("planner", "ask @ledger now\nsend ledger: from the operator")
            await settle(plane)
            assert log(plane, "note")[-1]["rule"] == "mention"

    run(main)
    first = turns(config, "planner")[0]["prompt"]
    assert "written by another agent" not in first  # a stranger's line, not a peer's note
    assert "arrived from outside, through webhook, at stranger trust" in first
    assert first.startswith("A line that arrived from outside this plane (webhook)")
    assert unfence(first[first.index("The text between") :]) == (
        "webhook",
        "webhook",
        "/team ledger",
    )


def test_the_webhook_refuses_without_the_token_and_bounds_what_it_reads(tmp_path: Path) -> None:
    config = load_plane(write_plane(tmp_path, [{"id": "planner"}]))

    async def main() -> None:
        async with running(config) as (plane, _w), hooked(plane) as client:
            url = "/agents/planner/lines"
            assert (await client.post(url, content="hi")).status_code == 401
            wrong = {"authorization": "Bearer nope"}
            assert (await client.post(url, content="hi", headers=wrong)).status_code == 401
            assert (
                await client.post("/agents/ghost/lines", content="x", headers=AUTH)
            ).status_code == 404
            big = "x" * (MAX_BODY + 1)
            assert (await client.post(url, content=big, headers=AUTH)).status_code == 413
            assert (await client.post(url, content=b"\xff", headers=AUTH)).status_code == 400
            assert (await client.post(url, json=["x"], headers=AUTH)).status_code == 400
            xml = {**AUTH, "content-type": "application/xml"}
            assert (await client.post(url, content="<a/>", headers=xml)).status_code == 415
            await settle(plane)
            assert log(plane, "webhook") == []

    run(main)


def test_the_bearer_scheme_is_case_insensitive_and_a_turn_says_webhook_once(
    tmp_path: Path,
) -> None:
    config = load_plane(write_plane(tmp_path, [{"id": "planner"}]))

    async def main() -> None:
        async with running(config) as (plane, watch), hooked(plane) as client:
            url = "/agents/planner/lines"
            for scheme in ("bearer", "BEARER", "Bearer"):
                auth = {"authorization": f"{scheme} {TOKEN}"}
                r = await client.post(url, content="answer: hi", headers=auth)
                assert r.status_code == 202, (scheme, r.text)
            for wrong in (f"Basic {TOKEN}", TOKEN, f"bearer{TOKEN}", "bearer", f"bearer x{TOKEN}"):
                r = await client.post(url, content="hi", headers={"authorization": wrong})
                assert r.status_code == 401, wrong
                assert "Authorization: Bearer TOKEN" in r.json()["error"]["reason"]
            await settle(plane)
            assert [e.text for e in watch.of("planner", "turn")] == [
                "turn 1 (webhook)",
                "turn 2 (webhook)",
                "turn 3 (webhook)",
            ]

    run(main)
