"""Agents' public keys in the store (schema v12), on both backends: bound to an agent of
the workspace, replaced whole, each change audited and a re-registration of the same key
not counted as one."""

from __future__ import annotations

import pytest

from melchior.mellan.relay.store.base import NotFoundError, Record, Store
from melchior.mellan.sealing import KeyPair
from storekit import RECEIVER, WS, db_url_fixture, store_fixture  # noqa: F401


def test_a_key_is_registered_replaced_and_audited(store: Store) -> None:
    first, second = KeyPair.generate().public, KeyPair.generate().public
    assert store.agent_key(WS, RECEIVER) is None
    record = Record(actor=RECEIVER, action="agent.key", rule="agent-key", reason="joined")
    key, changed = store.set_agent_key(WS, RECEIVER, first.text(), first.fingerprint, record=record)
    assert changed
    assert key.public_key == first.text()
    assert key.fingerprint == first.fingerprint
    _, again = store.set_agent_key(WS, RECEIVER, first.text(), first.fingerprint, record=record)
    assert not again
    key, changed = store.set_agent_key(
        WS, RECEIVER, second.text(), second.fingerprint, record=record
    )
    assert changed
    stored = store.agent_key(WS, RECEIVER)
    assert stored is not None
    assert stored.fingerprint == second.fingerprint
    actions = [r.action for r in store.audit_since(WS) if r.subject == RECEIVER]
    assert actions.count("agent.key") == 2


def test_a_key_for_an_unknown_agent_is_refused(store: Store) -> None:
    pub = KeyPair.generate().public
    with pytest.raises(NotFoundError, match="no agent"):
        store.set_agent_key(WS, "private/nobody", pub.text(), pub.fingerprint)
