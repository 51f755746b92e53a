"""Files melchior keeps: where they live (XDG) and how they are written (atomically).

Two rules every writer shares, so they are written once:

- **Where.** ``$XDG_DATA_HOME``, ``$XDG_CONFIG_HOME`` and ``$XDG_CACHE_HOME`` as the XDG
  base-directory spec has them: an unset, empty or *relative* value means the default
  under the home directory (a relative one must be ignored, or a command run from
  another directory would read and write somewhere else).
- **How.** A reader sees the old content or the new, never half: the bytes go to a
  temporary file beside the target (created with ``O_EXCL | O_NOFOLLOW``, so a planted
  file or symlink under that name is refused rather than followed), are fsynced, and
  replace the target with one ``rename``. Files are private (0600) unless asked
  otherwise, and a directory created for them is 0700.

No heavy imports: ``melchior tool`` reaches this module on its path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

_XDG = {
    "data": ("XDG_DATA_HOME", (".local", "share")),
    "config": ("XDG_CONFIG_HOME", (".config",)),
    "cache": ("XDG_CACHE_HOME", (".cache",)),
}


def xdg(kind: str, env: Mapping[str, str] | None = None) -> Path:
    """The XDG base directory of ``kind`` (``data``, ``config`` or ``cache``)."""
    variable, default = _XDG[kind]
    value = (os.environ if env is None else env).get(variable) or ""
    if value and os.path.isabs(value):
        return Path(value)
    home = (os.environ if env is None else env).get("HOME") or str(Path.home())
    return Path(home, *default)


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600, make_parent: bool = False) -> None:
    """Replace ``path`` with ``data`` so that readers see the old bytes or the new ones."""
    import secrets  # start-up: only writers pay for it

    if make_parent:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_private(path: Path, text: str) -> None:
    """``text`` to ``path``, readable by its owner only, its directory created 0700."""
    atomic_write(path, text.encode("utf-8"), mode=0o600, make_parent=True)
