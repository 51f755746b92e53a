"""``mellan relay migrate``: copy a relay's database into an empty PostgreSQL database."""

from __future__ import annotations

import sys


def migrate_command(source: str | None, target: str) -> int:
    print("mellan relay migrate: not yet available", file=sys.stderr)
    return 1
