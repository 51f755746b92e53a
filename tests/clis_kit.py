"""The real coding-agent CLIs for the tests that drive them: where ``make clis`` put them.

``scripts/cli-pins`` pins each CLI's releases (newest, oldest supported, and one just
below the range); ``make clis`` installs each under ``$MELCHIOR_CLI_DIR`` (default
``$XDG_CACHE_HOME/melchior/cli``, shared by every checkout). :func:`need` hands a test
the binary, or skips it with the reason — except on CI, where a missing CLI is a
failure: the point of running them there is that they run. Off CI a ``newest`` CLI may
also come from PATH (never a stand-in).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLI_DIR = Path(
    os.environ.get("MELCHIOR_CLI_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "melchior" / "cli"
)
ON_CI = os.environ.get("CI", "").lower() == "true"
STAND_INS = Path(__file__).resolve().parent / "stand_ins"


def _pins_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_pins", ROOT / "scripts" / "clis.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PINS = _pins_module()


def pinned(adapter: str, role: str = "newest") -> str:
    """The release of ``adapter``'s CLI pinned for ``role``."""
    for pin in PINS.read():
        if pin.adapter == adapter:
            return str(pin.releases[role])
    raise KeyError(f"{adapter} is not pinned in scripts/cli-pins")


def _on_path(name: str) -> str | None:
    path = os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != STAND_INS
    )
    found = shutil.which(name, path=path)
    if found is None or b"stand-in" in Path(found).read_bytes()[:300]:
        return None
    return found


def find(adapter: str, role: str = "newest") -> str | None:
    """The installed binary of ``adapter``'s CLI at the ``role`` release, or None."""
    for pin in PINS.read():
        if pin.adapter == adapter and role in pin.releases:
            if PINS.installed(pin, CLI_DIR, role):
                return str(pin.binary(CLI_DIR, role))
            if role == "newest" and not ON_CI:
                return _on_path(pin.bin)
    return None


def need(adapter: str, role: str = "newest") -> str:
    """The binary, or the test skips (fails on CI) saying how to get it."""
    found = find(adapter, role)
    if found is not None:
        return found
    why = (
        f"the real {adapter} CLI ({role}, {pinned(adapter, role)}) is not installed in "
        f"{CLI_DIR}: run make clis (it needs npm)"
    )
    if ON_CI:
        pytest.fail(f"{why}; on CI it is required")
    pytest.skip(why)
