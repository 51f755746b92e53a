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
  offers one with that fingerprint, so nothing typed by hand becomes a key. A pin that
  is replaced keeps the key it held as an *earlier* one: a result signed by the key a
  request was sealed to still opens after the receiver rotated (see below).
- **Retired pairs** (``agents/<id>.retired``, 0600): ``mellan agent rotate-key`` makes a
  new pair and keeps the old one here for :data:`RETIRED_KEEP_SECONDS`, because tasks
  sealed to the old key may still be queued, and results sealed to it may still be on
  their way back. An envelope names the key it was sealed to (its fingerprint), so the
  opener picks the pair by it (:func:`keypair_for`), never by trying each.

The directory is handed in (the CLI's configuration directory), so the receiver and the
commands agree on it without this module knowing the CLI.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from melchior.files import write_private
from melchior.mellan.sealing import FINGERPRINT, KeyPair, PublicKey

PINS_FILE = "pins.json"
RETIRED_KEEP_SECONDS = 30 * 24 * 3600.0
"""How long a rotated-out key pair is kept to open what was sealed to it (tasks queued
before the rotation, results on their way back); after that it is dropped."""
MAX_EARLIER = 8
"""How many replaced keys a pin remembers (each rotation the operator accepted)."""


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


def retired_file(agents_dir: Path, agent: str) -> Path:
    """Where an agent's rotated-out key pairs are kept: beside its key."""
    return _retired_beside(key_file(agents_dir, agent))


def _retired_beside(key: Path) -> Path:
    return key.with_suffix(".retired")


def _pending_beside(key: Path) -> Path:
    """Where a rotation keeps the new pair until it becomes the key."""
    return key.with_suffix(".key.new")


def _retired(path: Path, now: float) -> list[tuple[KeyPair, float]]:
    """The pairs in a retired file still inside their keep window (a missing file: none)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise KeyProblem(f"cannot read the retired keys {path}: {exc}") from None
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise KeyProblem(f"{path} is readable by others; treat the private keys in it as leaked")
    out = []
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("retired_at"), int | float):
            raise KeyProblem(f"{path}: an entry is not {{'key': …, 'retired_at': …}}")
        if now - float(entry["retired_at"]) >= RETIRED_KEEP_SECONDS:
            continue
        try:
            out.append((KeyPair.parse(str(entry.get("key", ""))), float(entry["retired_at"])))
        except ValueError as exc:
            raise KeyProblem(f"{path}: {exc}") from None
    return out


def keypairs(agents_dir: Path, agent: str) -> list[KeyPair]:
    """The agent's current pair first, then the retired ones still kept, newest first."""
    return read_keypairs(key_file(agents_dir, agent), agent)


def read_keypairs(path: Path, agent: str) -> list[KeyPair]:
    """:func:`keypairs` for the key file ``path`` (its retired file beside it)."""
    retired = sorted(_retired(_retired_beside(path), time.time()), key=lambda e: -e[1])
    return [read_keypair(path, agent), *(pair for pair, _ in retired)]


def keypair_for(pairs: list[KeyPair], fingerprint: object) -> KeyPair:
    """The pair among ``pairs`` whose public key has ``fingerprint`` (what an envelope says
    it was sealed to); the current one (first) when none has: opening then refuses, naming
    both fingerprints."""
    for pair in pairs:
        if pair.public.fingerprint == fingerprint:
            return pair
    return pairs[0]


@dataclass(frozen=True)
class Rotation:
    """A rotation under way: the new pair is written beside the key (``.key.new``) before
    the relay hears of it, so a crash between the two never loses the private half of the
    key the relay hands out; :meth:`commit` makes it the agent's key, :meth:`abandon`
    forgets it."""

    agents_dir: Path
    agent: str
    old: KeyPair
    new: KeyPair

    @property
    def pending(self) -> Path:
        return _pending_beside(key_file(self.agents_dir, self.agent))

    def commit(self) -> None:
        """The new pair becomes the agent's key; the old one is retired (kept to open what
        was sealed to it), and retired pairs past their window are dropped."""
        now = time.time()
        path = retired_file(self.agents_dir, self.agent)
        kept = [(p, at) for p, at in _retired(path, now) if p.public != self.old.public]
        kept.append((self.old, now))
        entries = [{"key": p.private_text(), "retired_at": at} for p, at in kept]
        write_private(path, json.dumps(entries, indent=2) + "\n")
        os.replace(self.pending, key_file(self.agents_dir, self.agent))

    def abandon(self) -> None:
        self.pending.unlink(missing_ok=True)


def begin_rotation(agents_dir: Path, agent: str) -> Rotation:
    """Start replacing ``agent``'s key pair (refused when it has none on this machine). A
    rotation that was interrupted (its new pair written, the relay perhaps told) is
    resumed with the same new pair, so the key the relay may hold is the one kept."""
    old = load_keypair(agents_dir, agent)
    pending = _pending_beside(key_file(agents_dir, agent))
    if pending.exists():
        return Rotation(agents_dir, agent, old, read_keypair(pending, agent))
    rotation = Rotation(agents_dir, agent, old, KeyPair.generate())
    write_private(rotation.pending, rotation.new.private_text() + "\n")
    return rotation


@dataclass(frozen=True)
class Pin:
    """What this machine holds for one agent: the key pinned, a fingerprint trusted to
    replace it (``None`` when no change was accepted), and the keys pinned before it."""

    key: PublicKey | None
    trusted: str | None = None
    earlier: tuple[PublicKey, ...] = ()


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
            earlier = entry.get("earlier") or []
            try:
                before = tuple(PublicKey.parse(k) for k in earlier)
            except (TypeError, ValueError) as exc:
                raise KeyProblem(f"{self.path}: an earlier key of {agent!r}: {exc}") from None
            out[agent] = Pin(key, trusted if isinstance(trusted, str) else None, before)
        return out

    def _write(self, pins: dict[str, Pin]) -> None:
        data = {
            agent: {
                "key": pin.key.text() if pin.key else None,
                "trusted": pin.trusted,
                "earlier": [k.text() for k in pin.earlier],
            }
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
            earlier = (pin.key, *pin.earlier) if pin is not None and pin.key else ()
            pins[agent] = Pin(offered, None, earlier[:MAX_EARLIER])
            self._write(pins)
            return offered
        raise KeyChanged(agent, pin.key.fingerprint, offered.fingerprint)

    def known(self, agent: str, fingerprint: object) -> PublicKey | None:
        """The key with ``fingerprint`` this machine pinned for ``agent``, now or before a
        rotation it accepted; ``None`` when it never pinned one. For checking what was
        signed with the key a request was sealed to — never for sealing anew."""
        pin = self._read().get(agent)
        if pin is None:
            return None
        for key in (pin.key, *pin.earlier):
            if key is not None and key.fingerprint == fingerprint:
                return key
        return None

    def trust(self, agent: str, fingerprint: str) -> Pin:
        """Accept ``fingerprint`` as ``agent``'s key from now on (pinned at next sight)."""
        fingerprint = fingerprint.strip().lower()
        if not FINGERPRINT.fullmatch(fingerprint):
            raise KeyProblem(
                f"{fingerprint!r} is not a key fingerprint (ten groups of four hex digits, "
                "as 'mellan agent show' prints it)"
            )
        pins = self._read()
        old = pins.get(agent)
        pinned = old.key if old else None
        already = pinned is not None and pinned.fingerprint == fingerprint
        pins[agent] = Pin(pinned, None if already else fingerprint, old.earlier if old else ())
        self._write(pins)
        return pins[agent]


def private_mode(path: Path) -> int:
    """The permission bits of ``path`` (for tests and ``mellan agent show``)."""
    return stat.S_IMODE(os.stat(path).st_mode)
