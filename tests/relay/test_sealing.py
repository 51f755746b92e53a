"""The sealing envelope (mellan/sealing.py): what is sealed opens, for exactly its
recipient, sender and routing fields, and nothing else does — each refusal naming why.

Property tests over generated parts and fields: the round trip, any one byte of the
ciphertext or signature flipped, any one routing field changed (a replay into another
task is a changed ``task`` or ``message``), a wrong recipient or sender key.
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from melchior.mellan import sealing
from melchior.mellan.sealing import (
    MEDIA_TYPE,
    SEALED_URI,
    Binding,
    KeyPair,
    PublicKey,
    SealRefused,
    envelope_of,
    is_sealed,
    open_envelope,
    seal,
    sealed_message,
)

CALLER = KeyPair.generate()
RECEIVER = KeyPair.generate()
OTHER = KeyPair.generate()

ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40)
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | ids
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ids, inner, max_size=4),
    max_leaves=12,
)
parts_strategy = st.lists(
    st.one_of(
        st.builds(lambda t: {"text": t}, st.text(max_size=200)),
        st.builds(lambda d: {"data": d}, st.dictionaries(ids, json_values, max_size=4)),
    ),
    min_size=1,
    max_size=4,
)
hops_strategy = st.none() | st.builds(
    lambda c, h, p: {"chain": c, "hop": h, "path": p},
    ids,
    st.integers(1, 4),
    st.lists(ids, min_size=1, max_size=3),
)
bindings = st.builds(
    Binding,
    direction=st.sampled_from(["request", "result"]),
    workspace=ids,
    caller=ids,
    receiver=ids,
    capability=ids,
    context=st.none() | ids,
    task=st.none() | ids,
    message=ids,
    hops=hops_strategy,
)


def _binding(**change: Any) -> Binding:
    base = Binding(
        direction="request",
        workspace="private",
        caller="private/ops",
        receiver="private/codex",
        capability="review",
        context="ctx-1",
        task=None,
        message="m-1",
    )
    return replace(base, **change)


def _open(envelope: Any, binding: Binding, me: KeyPair = RECEIVER, sender: PublicKey | None = None):
    return open_envelope(envelope, binding=binding, me=me, sender=sender or CALLER.public)


@given(
    parts=parts_strategy,
    binding=bindings,
    metadata=st.none() | st.dictionaries(ids, json_values, max_size=3),
)
def test_what_is_sealed_opens_as_it_was(parts, binding, metadata) -> None:
    env = seal(parts, binding=binding, to=RECEIVER.public, sender=CALLER, metadata=metadata)
    # the envelope survives JSON as the relay stores it
    env = json.loads(json.dumps(env))
    opened = _open(env, binding)
    assert list(opened.parts) == parts
    assert opened.metadata == metadata


def _flip(text: str, index: int, bit: int) -> str:
    raw = bytearray(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    raw[index % len(raw)] ^= 1 << bit
    return base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


@settings(max_examples=60)
@given(
    parts=parts_strategy,
    field=st.sampled_from(["sealed", "sig"]),
    index=st.integers(0, 10_000),
    bit=st.integers(0, 7),
)
def test_any_flipped_byte_is_refused(parts, field, index, bit) -> None:
    binding = _binding()
    env = seal(parts, binding=binding, to=RECEIVER.public, sender=CALLER)
    env[field] = _flip(env[field], index, bit)
    with pytest.raises(SealRefused) as caught:
        _open(env, binding)
    assert caught.value.rule == "signature"
    assert "altered" in str(caught.value)


FIELDS = [
    "direction",
    "workspace",
    "caller",
    "receiver",
    "capability",
    "context",
    "task",
    "message",
    "hops",
]


def _other_value(field: str, old: Any, data: Any) -> Any:
    """A value of routing field ``field`` other than ``old``, drawn from its strategy."""
    if field == "direction":
        return "result" if old == "request" else "request"
    if field == "hops":
        return data.draw(hops_strategy.filter(lambda h: h != old))
    if field in ("context", "task"):
        return data.draw((st.none() | ids).filter(lambda v: v != old))
    return data.draw(ids.filter(lambda v: v != old))


@settings(max_examples=60)
@given(parts=parts_strategy, binding=bindings, field=st.sampled_from(FIELDS), data=st.data())
def test_any_changed_routing_field_is_refused(parts, binding, field, data) -> None:
    env = seal(parts, binding=binding, to=RECEIVER.public, sender=CALLER)
    new = _other_value(field, getattr(binding, field), data)
    moved = replace(binding, **{field: new})
    with pytest.raises(SealRefused) as caught:
        _open(env, moved)
    assert caught.value.rule == "binding"
    assert field in caught.value.reason


def test_the_copy_of_the_fields_is_not_trusted() -> None:
    """A relay that rewrites the envelope's copy of the fields to match the task it moved
    the payload to is still refused: the fields are bound by the signature and by HPKE."""
    env = seal([{"text": "ledger"}], binding=_binding(), to=RECEIVER.public, sender=CALLER)
    moved = _binding(task="t-other")
    env["bound"] = moved.as_dict()
    with pytest.raises(SealRefused) as caught:
        _open(env, moved)
    assert caught.value.rule == "signature"


def test_replay_into_another_task_is_refused_with_both_tasks_named() -> None:
    bound = _binding(direction="result", task="t-1")
    env = seal([{"text": "done"}], binding=bound, to=RECEIVER.public, sender=CALLER)
    with pytest.raises(SealRefused) as caught:
        _open(env, replace(bound, task="t-2"))
    assert "'t-1'" in caught.value.reason
    assert "'t-2'" in caught.value.reason


def test_a_wrong_recipient_key_is_refused_before_decrypting() -> None:
    env = seal([{"text": "x"}], binding=_binding(), to=RECEIVER.public, sender=CALLER)
    with pytest.raises(SealRefused) as caught:
        _open(env, _binding(), me=OTHER)
    assert caught.value.rule == "recipient"
    assert OTHER.public.fingerprint in caught.value.reason


def test_a_sender_other_than_the_pinned_key_is_refused() -> None:
    env = seal([{"text": "x"}], binding=_binding(), to=RECEIVER.public, sender=OTHER)
    with pytest.raises(SealRefused) as caught:
        _open(env, _binding())
    assert caught.value.rule == "sender"


def test_a_forged_sender_fingerprint_does_not_pass_the_signature() -> None:
    """Someone with the recipient's public key can seal to it, but cannot sign as the caller."""
    env = seal([{"text": "x"}], binding=_binding(), to=RECEIVER.public, sender=OTHER)
    env["from"] = CALLER.public.fingerprint
    with pytest.raises(SealRefused) as caught:
        _open(env, _binding())
    assert caught.value.rule == "signature"


@given(st.dictionaries(ids, json_values, max_size=8) | json_values)
def test_hostile_envelopes_are_refused_with_a_reason(junk) -> None:
    with pytest.raises(SealRefused) as caught:
        _open(junk, _binding())
    assert caught.value.reason


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"v": 2}, "suite"),
        ({"suite": "rsa"}, "suite"),
        ({"sealed": "!!!"}, "malformed"),
        ({"sealed": 5}, "malformed"),
        ({"bound": []}, "binding"),
    ],
)
def test_malformed_fields_name_their_rule(change, rule) -> None:
    env = seal([{"text": "x"}], binding=_binding(), to=RECEIVER.public, sender=CALLER)
    env.update(change)
    with pytest.raises(SealRefused) as caught:
        _open(env, _binding())
    assert caught.value.rule == rule


@given(parts=parts_strategy, hops=hops_strategy)
def test_the_a2a_message_is_well_formed_and_opaque(parts, hops) -> None:
    binding = _binding(hops=hops)
    env = seal(parts, binding=binding, to=RECEIVER.public, sender=CALLER)
    msg = sealed_message(env, message_id="m-1", context="ctx-1", hops=hops)
    assert msg["extensions"] == [SEALED_URI]
    assert msg["parts"] == [{"data": env, "mediaType": MEDIA_TYPE}]
    assert is_sealed(msg)
    assert envelope_of(msg) == env
    text = json.dumps(msg)
    for part in parts:
        if part.get("text") and len(part["text"]) > 8:
            assert part["text"] not in text


def test_half_sealed_messages_are_refused() -> None:
    env = seal([{"text": "x"}], binding=_binding(), to=RECEIVER.public, sender=CALLER)
    msg = sealed_message(env, message_id="m-1")
    msg["parts"].append({"text": "and something in clear"})
    with pytest.raises(SealRefused, match="exactly one"):
        envelope_of(msg)
    assert not is_sealed(msg)
    undeclared = {"parts": [{"data": env, "mediaType": MEDIA_TYPE}]}
    with pytest.raises(SealRefused):
        envelope_of(undeclared)
    assert envelope_of({"parts": [{"text": "clear"}]}) is None


def test_keys_round_trip_through_their_text_forms() -> None:
    pair = KeyPair.generate()
    again = KeyPair.parse(pair.private_text())
    assert again.public == pair.public
    assert PublicKey.parse(pair.public.text()) == pair.public
    assert len(pair.public.fingerprint.split("-")) == 10
    for bad in ["", "mellan-key-v1:", "mellan-key-v1:AAAA", "ssh-ed25519 AAAA", 7]:
        with pytest.raises(ValueError, match="public key"):
            PublicKey.parse(bad)


def test_the_field_length_is_bounded() -> None:
    with pytest.raises(SealRefused, match="over"):
        seal(
            [{"text": "x"}],
            binding=_binding(task="t" * (sealing.MAX_FIELD + 1)),
            to=RECEIVER.public,
            sender=CALLER,
        )


@settings(max_examples=60)
@given(parts=parts_strategy, binding=bindings, field=st.sampled_from(FIELDS), data=st.data())
def test_a_sender_reads_back_exactly_what_it_bound_and_nothing_rewritten(
    parts, binding, field, data
) -> None:
    """``signed_binding``: the sender's own envelope, read back through JSON, states the
    binding it was sealed for; any field of its carried copy rewritten (as a relay could)
    no longer verifies, whatever the new value."""
    env = json.loads(json.dumps(seal(parts, binding=binding, to=RECEIVER.public, sender=CALLER)))
    assert sealing.signed_binding(env, to=RECEIVER.public, sender=CALLER.public) == binding
    env["bound"][field] = _other_value(field, env["bound"][field], data)
    with pytest.raises(SealRefused) as caught:
        sealing.signed_binding(env, to=RECEIVER.public, sender=CALLER.public)
    assert caught.value.rule == "signature"


@given(junk=st.dictionaries(ids, json_values, max_size=10) | json_values)
def test_a_bound_copy_that_is_not_a_binding_is_refused(junk) -> None:
    env = seal([{"text": "x"}], binding=_binding(), to=RECEIVER.public, sender=CALLER)
    env["bound"] = junk
    with pytest.raises(SealRefused) as caught:
        sealing.signed_binding(env, to=RECEIVER.public, sender=CALLER.public)
    assert caught.value.rule in ("malformed", "signature")


def test_reading_back_with_other_keys_names_them() -> None:
    env = seal([{"text": "x"}], binding=_binding(), to=RECEIVER.public, sender=CALLER)
    with pytest.raises(SealRefused) as caught:
        sealing.signed_binding(env, to=OTHER.public, sender=CALLER.public)
    assert caught.value.rule == "sender"
    assert OTHER.public.fingerprint in caught.value.reason
