"""The files a key rotation leaves on an agent's machine, and the pins a caller keeps
across one: pure file work on a temporary directory, no relay.

- a rotation writes the new pair beside the key *before* the relay hears of it, so an
  interruption never loses the private half of the key the relay may hold, and running
  it again resumes with that same pair;
- committed, the old pair is retired (0600), opens what was sealed to it for the keep
  window and no longer after, and is found by the fingerprint an envelope names;
- a pin replaced by a trusted fingerprint remembers the key it held (for checking what
  was signed with it), and a retired file readable by others is refused, not used."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from melchior.mellan import keys
from melchior.mellan.keys import KeyChanged, KeyProblem, Pins, begin_rotation, ensure_keypair
from melchior.mellan.sealing import KeyPair

AGENT = "private/ops"


def test_a_rotation_keeps_the_old_pair_and_resumes_after_an_interruption(tmp_path: Path) -> None:
    old, made = ensure_keypair(tmp_path, AGENT)
    assert made
    first = begin_rotation(tmp_path, AGENT)
    assert first.old.public == old.public
    assert stat.S_IMODE(first.pending.stat().st_mode) == 0o600
    # interrupted here (the relay may have taken the new key): the same pair again
    again = begin_rotation(tmp_path, AGENT)
    assert again.new.public == first.new.public
    again.commit()
    assert not first.pending.exists()
    assert keys.load_keypair(tmp_path, AGENT).public == first.new.public
    retired = keys.retired_file(tmp_path, AGENT)
    assert stat.S_IMODE(retired.stat().st_mode) == 0o600
    pairs = keys.keypairs(tmp_path, AGENT)
    assert [p.public for p in pairs] == [first.new.public, old.public]
    # the opener picks by the fingerprint the envelope names; unknown: the current one
    assert keys.keypair_for(pairs, old.public.fingerprint).public == old.public
    assert keys.keypair_for(pairs, "0000").public == first.new.public


def test_an_abandoned_rotation_leaves_the_key_as_it_was(tmp_path: Path) -> None:
    old, _ = ensure_keypair(tmp_path, AGENT)
    rotation = begin_rotation(tmp_path, AGENT)
    rotation.abandon()
    assert not rotation.pending.exists()
    assert [p.public for p in keys.keypairs(tmp_path, AGENT)] == [old.public]


def test_retired_pairs_are_dropped_after_their_window(tmp_path: Path) -> None:
    ensure_keypair(tmp_path, AGENT)
    begin_rotation(tmp_path, AGENT).commit()
    second = begin_rotation(tmp_path, AGENT)
    second.commit()
    retired = keys.retired_file(tmp_path, AGENT)
    entries = json.loads(retired.read_text())
    assert len(entries) == 2
    entries[0]["retired_at"] = time.time() - keys.RETIRED_KEEP_SECONDS - 1
    retired.write_text(json.dumps(entries))
    pairs = keys.keypairs(tmp_path, AGENT)
    assert len(pairs) == 2  # the current one and the one retired just now
    assert pairs[1].public == second.old.public


def test_a_retired_file_readable_by_others_or_malformed_is_refused(tmp_path: Path) -> None:
    ensure_keypair(tmp_path, AGENT)
    begin_rotation(tmp_path, AGENT).commit()
    retired = keys.retired_file(tmp_path, AGENT)
    os.chmod(retired, 0o644)
    with pytest.raises(KeyProblem, match="readable by others"):
        keys.keypairs(tmp_path, AGENT)
    os.chmod(retired, 0o600)
    retired.write_text(json.dumps([{"key": "nope", "retired_at": time.time()}]))
    with pytest.raises(KeyProblem, match="private key"):
        keys.keypairs(tmp_path, AGENT)
    retired.write_text(json.dumps([{"key": KeyPair.generate().private_text()}]))
    with pytest.raises(KeyProblem, match="retired_at"):
        keys.keypairs(tmp_path, AGENT)


def test_a_pin_replaced_by_trust_remembers_the_key_it_held(tmp_path: Path) -> None:
    pins = Pins(tmp_path)
    first, second = KeyPair.generate().public, KeyPair.generate().public
    assert pins.check(AGENT, first) == first
    with pytest.raises(KeyChanged):
        pins.check(AGENT, second)
    assert pins.known(AGENT, second.fingerprint) is None  # offered is not known
    pins.trust(AGENT, second.fingerprint)
    assert pins.known(AGENT, second.fingerprint) is None  # trusted, not yet seen
    assert pins.check(AGENT, second) == second
    assert pins.known(AGENT, first.fingerprint) == first
    assert pins.known(AGENT, second.fingerprint) == second
    # remembering is not accepting: the old key is not the pin any more
    with pytest.raises(KeyChanged):
        pins.check(AGENT, first)
    assert pins.known("local/other", first.fingerprint) is None
