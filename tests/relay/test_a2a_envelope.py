"""The one A2A form of the envelope: a message maps to A2A and back without loss."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.a2a_message import chain_in, from_a2a, text_of, to_a2a
from melchior.envelope import Message
from melchior.policy.hops import HOPS_URI, Chain

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz/._-", min_size=1, max_size=20)
PARTS = st.lists(
    st.one_of(
        st.builds(lambda t: {"text": t}, st.text(max_size=30)),
        st.builds(lambda d: {"data": d}, st.dictionaries(st.text(max_size=5), st.integers())),
        st.builds(lambda u: {"url": u, "mediaType": "text/plain"}, st.text(max_size=20)),
    ),
    min_size=1,
    max_size=4,
)


@given(
    sender=NAMES,
    recipient=NAMES,
    parts=PARTS,
    hop=st.integers(min_value=1, max_value=9),
    path=st.lists(NAMES, max_size=3),
    mid=st.text(min_size=1, max_size=20),
    about=st.none() | st.text(min_size=1, max_size=10),
    context=st.none() | st.text(min_size=1, max_size=10),
)
def test_a_message_survives_the_a2a_round_trip(
    sender: str,
    recipient: str,
    parts: list[dict[str, object]],
    hop: int,
    path: list[str],
    mid: str,
    about: str | None,
    context: str | None,
) -> None:
    chain = Chain("c0ffee", hop, (*path, sender))
    sent = Message(
        sender, recipient, text_of(parts), "task", chain, mid, about, context, tuple(parts)
    )
    wire = to_a2a(sent)
    assert wire["parts"] == parts
    assert wire["messageId"] == mid
    assert wire["metadata"][HOPS_URI] == chain.as_dict()
    back = from_a2a(wire, sender=sender, recipient=recipient)
    assert back == sent._replace(metadata=None)


def test_the_sender_is_the_last_name_on_the_path_whatever_the_payload_says() -> None:
    md = {HOPS_URI: {"chain": "c", "hop": 2.0, "path": ["alice", "mallory"]}}
    assert chain_in("local/codex", md) == Chain("c", 2, ("alice", "mallory", "local/codex"))
    assert chain_in("local/codex", None, None).hop == 1  # no chain: a person started it


@pytest.mark.parametrize("bad", [[1], {"chain": "", "hop": 1}, {"chain": "c", "hop": 1.5}])
def test_a_malformed_chain_is_a_clear_error(bad: object) -> None:
    with pytest.raises(ValueError, match=HOPS_URI):
        chain_in("x", {HOPS_URI: bad})
