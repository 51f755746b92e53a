"""Agent keys on their machine and pins on the caller's (mellan/keys.py): a key pair made
once, private (0600) and refused when it is not; a destination's key pinned on first use,
a changed key refused naming both fingerprints until the operator trusts the new one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from melchior.mellan.keys import (
    KeyChanged,
    KeyProblem,
    Pins,
    ensure_keypair,
    key_file,
    load_keypair,
    private_mode,
)
from melchior.mellan.sealing import KeyPair


def test_a_key_pair_is_made_once_and_kept_private(tmp_path: Path) -> None:
    pair, made = ensure_keypair(tmp_path, "private/ops")
    assert made
    path = key_file(tmp_path, "private/ops")
    assert private_mode(path) == 0o600
    again, made_again = ensure_keypair(tmp_path, "private/ops")
    assert not made_again
    assert again.public == pair.public
    assert pair.public.text() not in path.read_text()  # the file holds the private half


def test_a_private_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    ensure_keypair(tmp_path, "private/ops")
    os.chmod(key_file(tmp_path, "private/ops"), 0o644)
    with pytest.raises(KeyProblem, match="readable by others"):
        load_keypair(tmp_path, "private/ops")


def test_a_missing_or_broken_key_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(KeyProblem, match="mellan join"):
        load_keypair(tmp_path, "private/ops")
    path = key_file(tmp_path, "private/ops")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a key")
    path.chmod(0o600)
    with pytest.raises(KeyProblem, match="private key file"):
        load_keypair(tmp_path, "private/ops")


def test_first_use_pins_and_a_swapped_key_is_refused_until_trusted(tmp_path: Path) -> None:
    pins = Pins(tmp_path)
    real, swapped = KeyPair.generate().public, KeyPair.generate().public
    assert pins.check("private/codex", real) == real
    assert pins.check("private/codex", real) == real
    with pytest.raises(KeyChanged) as caught:
        pins.check("private/codex", swapped)
    message = str(caught.value)
    assert real.fingerprint in message
    assert swapped.fingerprint in message
    assert f"mellan key trust private/codex {swapped.fingerprint}" in message
    # still refused on a second try: nothing changed by being offered
    with pytest.raises(KeyChanged):
        Pins(tmp_path).check("private/codex", swapped)
    # trusting another fingerprint does not let this one in
    pins.trust("private/codex", KeyPair.generate().public.fingerprint)
    with pytest.raises(KeyChanged):
        pins.check("private/codex", swapped)
    pins.trust("private/codex", swapped.fingerprint.upper())
    assert pins.check("private/codex", swapped) == swapped
    # the trusted key is now the pin, and the old one is refused in turn
    with pytest.raises(KeyChanged):
        pins.check("private/codex", real)
    assert private_mode(pins.path) == 0o600


def test_trust_refuses_what_is_not_a_fingerprint(tmp_path: Path) -> None:
    with pytest.raises(KeyProblem, match="not a key fingerprint"):
        Pins(tmp_path).trust("private/codex", "abcd")


def test_a_broken_pins_file_is_refused_not_ignored(tmp_path: Path) -> None:
    (tmp_path / "pins.json").write_text('{"private/codex": {"key": "junk"}}')
    with pytest.raises(KeyProblem, match="pinned for"):
        Pins(tmp_path).check("private/codex", KeyPair.generate().public)
