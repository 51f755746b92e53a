"""What the door remembers about a send's parties (``relay/caches/facts.py``) and the memo rule
under it (``relay/caches/memo.py``): kept for the ttl, never what would refuse, forgotten by the
replica that changes it — and a read that raced the change is never trusted.

Against a real SQLite store: a change made through the store is what another replica's
change looks like to this one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan.relay.caches.facts import DoorFacts
from melchior.mellan.relay.caches.memo import Memo
from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.notify import LocalNotifier
from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.base import Capability, NewRoute

WS, CALLER, RECEIVER = "w", "w/caller", "w/receiver"


def relay_on(tmp_path: Path) -> tuple[Relay, list[float]]:
    store = open_store(f"sqlite://{tmp_path / 'r.db'}")
    store.ensure_workspace(WS)
    store.add_agent(WS, CALLER, "", [])
    store.add_agent(WS, RECEIVER, "", [Capability("run", "run"), Capability("ask", "ask")])
    relay = Relay(store=store, notifier=LocalNotifier(), public_url="http://relay.invalid")
    now = [0.0]
    relay.facts = DoorFacts(ttl=2.0, clock=lambda: now[0])
    return relay, now


def test_grants_are_kept_for_the_ttl_and_a_missing_grant_never(tmp_path: Path) -> None:
    relay, now = relay_on(tmp_path)
    facts, store = relay.facts, relay.store

    async def granted() -> frozenset[str]:
        return await facts.granted(relay, WS, CALLER, RECEIVER)

    assert asyncio.run(granted()) == frozenset()
    grant = store.add_grant(WS, CALLER, RECEIVER, ["run"])  # elsewhere: seen at once
    assert asyncio.run(granted()) == {"run"}
    store.revoke_grant(WS, grant.id)  # elsewhere: trusted until the ttl runs out
    now[0] = 1.99
    assert asyncio.run(granted()) == {"run"}
    now[0] = 2.0
    assert asyncio.run(granted()) == frozenset()
    store.add_grant(WS, CALLER, RECEIVER, ["ask"])
    assert asyncio.run(granted()) == {"ask"}
    store.add_grant(WS, CALLER, RECEIVER, ["run"])
    assert asyncio.run(granted()) == {"ask"}  # remembered ...
    facts.forget()  # ... until this replica makes a change
    assert asyncio.run(granted()) == {"ask", "run"}


def test_an_unknown_agent_is_never_kept_a_known_one_is(tmp_path: Path) -> None:
    relay, _ = relay_on(tmp_path)
    facts, store = relay.facts, relay.store
    assert asyncio.run(facts.agent(relay, WS, "w/new")) is None
    store.add_agent(WS, "w/new", "", [])
    found = asyncio.run(facts.agent(relay, WS, "w/new"))
    assert found is not None
    assert found.id == "w/new"
    assert facts.agents.lookup((WS, "w/new")) == (True, found)


def test_no_route_is_a_fact_too_until_the_ttl_or_a_change_here(tmp_path: Path) -> None:
    relay, now = relay_on(tmp_path)
    facts, store = relay.facts, relay.store

    async def route() -> str | None:
        r = await facts.route(relay, WS, RECEIVER, "run")
        return None if r is None else r.session

    assert asyncio.run(route()) is None
    proposed = store.propose_route(NewRoute(WS, RECEIVER, "run", "codex", "a", session="s1"))
    store.approve_route(WS, proposed.id, "owner")
    assert asyncio.run(route()) is None  # approved elsewhere: within the ttl
    now[0] = 2.5
    assert asyncio.run(route()) == "s1"
    assert asyncio.run(facts.allow_private(relay, WS)) is False
    store.set_push_allow_private(WS, True)
    assert asyncio.run(facts.allow_private(relay, WS)) is False
    facts.forget()
    assert asyncio.run(facts.allow_private(relay, WS)) is True


def test_a_read_that_raced_a_change_here_is_not_kept(tmp_path: Path) -> None:
    """The grant is read, the replica revokes it and forgets before the read's answer is
    put: the stale answer must not be trusted for the next 2 s."""
    relay, _ = relay_on(tmp_path)
    facts, store = relay.facts, relay.store
    grant = store.add_grant(WS, CALLER, RECEIVER, ["run"])
    real = relay.store.granted_capabilities

    def racing(workspace: str, caller: str, receiver: str) -> set[str]:
        seen = real(workspace, caller, receiver)
        store.revoke_grant(WS, grant.id)
        facts.forget()  # what actions.revoke_grant does after its commit
        return seen

    relay.store.granted_capabilities = racing  # type: ignore[method-assign]
    assert asyncio.run(facts.granted(relay, WS, CALLER, RECEIVER)) == {"run"}
    relay.store.granted_capabilities = real  # type: ignore[method-assign]
    assert asyncio.run(facts.granted(relay, WS, CALLER, RECEIVER)) == frozenset()


@given(st.lists(st.tuples(st.sampled_from("pgfa"), st.integers(0, 3), st.floats(0, 3))))
def test_memo_answers_like_a_model(steps: list[tuple[str, int, float]]) -> None:
    """Against a dict model: a put is trusted for exactly ttl seconds, a put whose read
    began before a forget is dropped, and absence is told apart from a None fact."""
    now = [0.0]
    memo: Memo[int, int | None] = Memo(ttl=1.0, size=3, clock=lambda: now[0])
    model: dict[int, tuple[float, int | None]] = {}
    began = memo.generation
    for op, key, dt in steps:
        if op == "a":
            now[0] += dt
        elif op == "p":
            value = None if key == 0 else key * 10
            memo.put(key, value, began)
            if began == memo.generation:
                if len(model) >= 3:
                    model.clear()
                model[key] = (now[0] + 1.0, value)
            began = memo.generation
        elif op == "f":
            memo.forget()
            model.clear()
        else:
            hit = model.get(key)
            expect = (True, hit[1]) if hit is not None and now[0] < hit[0] else (False, None)
            if hit is not None and now[0] >= hit[0]:
                del model[key]
            assert memo.lookup(key) == expect
