"""An agent's key pair on its own machine, and the keys a caller has pinned for others.

Two files, both the caller's and the receiver's business, never the relay's:

- **The key pair** lives beside the agent's credential (``agents/<id>.key``, 0600). It is
  made once, by ``mellan join``, and only its public half is ever sent anywhere. A key
  file that is not private is refused, not used: a readable private key is a leaked one.
- **The pins** (``pins.json``): the public key this machine first saw for each agent it
  sealed to or opened from. The relay hands out keys, and a relay that swaps one could
  read what is sealed to the swapped key; pinning on first use turns that into a refusal
  naming both fingerprints, until the operator, having checked the new fingerprint with
  the agent's owner, accepts it (``mellan key trust AGENT FINGERPRINT``). Trusting
  records the fingerprint accepted; the key itself is pinned the next time the relay
  offers one with that fingerprint, so nothing typed by hand becomes a key.

The directory is handed in (the CLI's configuration directory), so the receiver and the
commands agree on it without this module knowing the CLI.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from melchior.files import write_private
from melchior.mellan.sealing import KeyPair, PublicKey

PINS_FILE = "pins.json"


class KeyProblem(Exception):
    """A key that cannot be used, saying why and what to do."""


class KeyChanged(KeyProblem):
    """The relay offered a key other than the one pinned for an agent."""

    def __init__(self, agent: str, pinned: str, offered: str) -> None:
        super().__init__(
            f"the key the relay gives for {agent} changed: pinned {pinned}, offered "
            f"{offered}. Nothing was sealed to it. If {agent}'s owner confirms the new "
            f"fingerprint, run 'mellan key trust {agent} {offered}'"
        )
        self.agent = agent
        self.pinned = pinned
        self.offered = offered


def key_file(agents_dir: Path, agent: str) -> Path:
    """Where an agent's private key is kept: beside its credential."""
    return agents_dir / f"{agent}.key"


def ensure_keypair(agents_dir: Path, agent: str) -> tuple[KeyPair, bool]:
    """The agent's key pair, made (and written 0600) if it has none; and whether it was made."""
    path = key_file(agents_dir, agent)
    if path.exists():
        return load_keypair(agents_dir, agent), False
    pair = KeyPair.generate()
    write_private(path, pair.private_text() + "\n")
    return pair, True


def load_keypair(agents_dir: Path, agent: str) -> KeyPair:
    """The agent's key pair; refused if missing, not private, or not a key file."""
    return read_keypair(key_file(agents_dir, agent), agent)


def read_keypair(path: Path, agent: str) -> KeyPair:
    """The key pair in ``path`` (``agent``'s, for the refusals' words), by the same rules."""
    try:
        info = path.stat()
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise KeyProblem(
                f"{path} is readable by others (mode {stat.S_IMODE(info.st_mode):o}); a private "
                "key must be 0600 — treat it as leaked: rotate it"
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KeyProblem(
            f"agent {agent} has no key pair on this machine ({path}); 'mellan join' makes one"
        ) from None
    except OSError as exc:
        raise KeyProblem(f"cannot read {path}: {exc}") from None
    try:
        return KeyPair.parse(text)
    except ValueError as exc:
        raise KeyProblem(f"{path}: {exc}") from None


@dataclass(frozen=True)
class Pin:
    """What this machine holds for one agent: the key pinned, and a fingerprint trusted
    to replace it (``None`` when no change was accepted)."""

    key: PublicKey | None
    trusted: str | None = None


class Pins:
    """The pins file: read whole, changed, written atomically (0600)."""

    def __init__(self, config_dir: Path) -> None:
        self.path = config_dir / PINS_FILE

    def _read(self) -> dict[str, Pin]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise KeyProblem(f"cannot read the pinned keys {self.path}: {exc}") from None
        if not isinstance(raw, dict):
            raise KeyProblem(f"{self.path} is not a pins file (an object of agents)")
        out: dict[str, Pin] = {}
        for agent, entry in raw.items():
            if not isinstance(entry, dict):
                raise KeyProblem(f"{self.path}: the entry for {agent!r} is not an object")
            try:
                key = PublicKey.parse(entry["key"]) if entry.get("key") else None
            except ValueError as exc:
                raise KeyProblem(f"{self.path}: the key pinned for {agent!r}: {exc}") from None
            trusted = entry.get("trusted")
            out[agent] = Pin(key, trusted if isinstance(trusted, str) else None)
        return out

    def _write(self, pins: dict[str, Pin]) -> None:
        data = {
            agent: {"key": pin.key.text() if pin.key else None, "trusted": pin.trusted}
            for agent, pin in sorted(pins.items())
        }
        write_private(self.path, json.dumps(data, indent=2) + "\n")

    def get(self, agent: str) -> Pin | None:
        return self._read().get(agent)

    def check(self, agent: str, offered: PublicKey) -> PublicKey:
        """The key to use for ``agent`` given the one the relay ``offered``: pinned on first
        use; the pinned one if they agree; the offered one if the operator trusted its
        fingerprint (then it becomes the pin); else :class:`KeyChanged`."""
        pins = self._read()
        pin = pins.get(agent)
        if pin is not None and pin.key == offered:
            return offered
        if pin is None or pin.key is None or pin.trusted == offered.fingerprint:
            pins[agent] = Pin(offered)
            self._write(pins)
            return offered
        raise KeyChanged(agent, pin.key.fingerprint, offered.fingerprint)

    def trust(self, agent: str, fingerprint: str) -> Pin:
        """Accept ``fingerprint`` as ``agent``'s key from now on (pinned at next sight)."""
        fingerprint = fingerprint.strip().lower()
        if len(fingerprint) != 49 or fingerprint.count("-") != 9:
            raise KeyProblem(
                f"{fingerprint!r} is not a key fingerprint (ten groups of four hex digits, "
                "as 'mellan agent show' prints it)"
            )
        pins = self._read()
        old = pins.get(agent)
        pinned = old.key if old else None
        already = pinned is not None and pinned.fingerprint == fingerprint
        pins[agent] = Pin(pinned, None if already else fingerprint)
        self._write(pins)
        return pins[agent]


def private_mode(path: Path) -> int:
    """The permission bits of ``path`` (for tests and ``mellan agent show``)."""
    return stat.S_IMODE(os.stat(path).st_mode)
