"""Install (or bump) the coding agents' CLIs pinned in scripts/cli-pins.

  python scripts/clis.py install DIR   each pinned release into DIR/PACKAGE@VERSION, with
                                       npm, unless it is already there (npm's cache
                                       makes a reinstall cheap, but none is cheaper)
  python scripts/clis.py bump          every newest= in scripts/cli-pins to npm's latest

Each release gets a directory of its own (with its own package.json, so npm does not
walk up into a parent project), which is what lets two releases of one CLI sit side by
side for the oldest-and-newest tests. A failed install is reported and the others go
on: off CI the tests that need it skip, on CI they fail and say which CLI is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

PINS = Path(__file__).resolve().parent / "cli-pins"
ROLES = ("newest", "oldest", "refused")


class Pin(NamedTuple):
    adapter: str
    package: str
    bin: str
    releases: dict[str, str]

    def folder(self, root: Path, role: str) -> Path:
        return root / f"{self.package.replace('/', '+')}@{self.releases[role]}"

    def binary(self, root: Path, role: str) -> Path:
        return self.folder(root, role) / "node_modules" / ".bin" / self.bin


def read(path: Path = PINS) -> list[Pin]:
    pins = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        adapter, package, binary, *rest = line.split()
        releases = dict(r.split("=", 1) for r in rest)
        if "newest" not in releases or not set(releases) <= set(ROLES):
            sys.exit(f"{path}:{n}: releases are {', '.join(f'{r}=' for r in ROLES)} (newest=)")
        pins.append(Pin(adapter, package, binary, releases))
    return pins


def installed(pin: Pin, root: Path, role: str) -> bool:
    meta = pin.folder(root, role) / "node_modules" / pin.package / "package.json"
    try:
        version = json.loads(meta.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError):
        return False
    return version == pin.releases[role] and pin.binary(root, role).exists()


def install(root: Path) -> int:
    npm = shutil.which("npm")
    missing = [(p, r) for p in read() for r in p.releases if not installed(p, root, r)]
    if not missing:
        return 0
    if npm is None:
        print("clis: npm is not on PATH; the real-CLI tests will skip (and fail on CI)")
        return 0
    for pin, role in missing:
        where = pin.folder(root, role)
        where.mkdir(parents=True, exist_ok=True)
        (where / "package.json").write_text('{"private": true}\n', encoding="utf-8")
        spec = f"{pin.package}@{pin.releases[role]}"
        print(f"clis: installing {spec} ({pin.adapter}, {role})", flush=True)
        done = subprocess.run(
            [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefer-offline", spec],
            cwd=where,
            check=False,
        )
        if done.returncode != 0 or not installed(pin, root, role):
            print(f"clis: could not install {spec}; the tests that run it will skip (fail on CI)")
    return 0


def bump() -> int:
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("clis: bump needs npm on PATH")
    text = PINS.read_text(encoding="utf-8")
    for pin in read():
        latest = subprocess.run(
            [npm, "view", pin.package, "version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if not re.fullmatch(r"\d+\.\d+\.\d+", latest):
            sys.exit(f"clis: npm says the latest {pin.package} is {latest!r}; not a release")
        old = pin.releases["newest"]
        line = re.compile(rf"^({re.escape(pin.adapter)}\s.*\bnewest=){re.escape(old)}\b", re.M)
        text = line.sub(rf"\g<1>{latest}", text)
        print(f"{pin.package}: {old} -> {latest}" if old != latest else f"{pin.package}: {old}")
    PINS.write_text(text, encoding="utf-8")
    print("then: make test (the real-CLI tests run the new releases)")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["install"] and len(argv) == 2:
        return install(Path(argv[1]))
    if argv == ["bump"]:
        return bump()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
