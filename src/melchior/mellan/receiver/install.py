"""A Linux user systemd unit for the receiver (seed 002: "Linux automatic installation
uses a user systemd service").

The unit runs ``mellan receiver run --config FILE`` with absolute paths (systemd does not
search PATH the way a shell does, and the config must not depend on the working
directory), restarts it on failure — but not when it stopped because its credential was
revoked (exit 77) or its configuration is wrong (exit 78): restarting cannot fix either,
and a loop would only fill the journal — and stops it with SIGTERM to the receiver alone
(``KillMode=mixed``), so the receiver stops its adapters' process groups itself and hands
running tasks back before systemd's SIGKILL.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from melchior.files import atomic_write, xdg


def unit_name(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", name).strip("-") or "receiver"
    return f"mellan-receiver-{safe}.service"


def mellan_path() -> str:
    """The absolute path of this installation's ``mellan`` (the venv's, when in one)."""
    beside = Path(sys.executable).parent / "mellan"
    if beside.is_file():
        return str(beside.absolute())
    found = shutil.which("mellan")
    if found is None:
        raise FileNotFoundError("cannot find the 'mellan' program (is melchior installed?)")
    return str(Path(found).absolute())


def quote(word: str) -> str:
    """One ExecStart word: specifiers (%) doubled, quoted when it has spaces or quotes."""
    word = word.replace("%", "%%")
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_text(name: str, mellan: str, config: Path) -> str:
    exec_start = " ".join(quote(w) for w in (mellan, "receiver", "run", "--config", str(config)))
    return f"""[Unit]
Description=mellan receiver for {name}
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
ExecStart={exec_start}
# Variables the configuration names (token_env, wake.secret_env), if any:
EnvironmentFile=-%h/.config/mellan/receiver.env
Environment=PYTHONUNBUFFERED=1
Restart=on-failure
RestartSec=5
# 77: the credential was revoked; 78: the configuration is wrong. Restarting fixes neither.
RestartPreventExitStatus=77 78
KillMode=mixed
TimeoutStopSec=30

[Install]
WantedBy=default.target
"""


def unit_path(name: str) -> Path:
    return xdg("config") / "systemd" / "user" / unit_name(name)


def install(name: str, config: Path) -> Path:
    """Write the unit file (0644) and return where it went."""
    path = unit_path(name)
    text = unit_text(name, mellan_path(), config)
    atomic_write(path, text.encode("utf-8"), mode=0o644, make_parent=True)
    return path


def commands(name: str) -> list[str]:
    unit = unit_name(name)
    return [
        "systemctl --user daemon-reload",
        f"systemctl --user enable --now {unit}",
        f"journalctl --user -u {unit} -f",
        'loginctl enable-linger "$USER"   # keep it running after you log out',
    ]
