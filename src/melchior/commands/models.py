"""List the models your configured providers offer; no inference is run.

Providers are the [providers.NAME] tables of $XDG_CONFIG_HOME/melchior/config.toml
(kind = "openai" | "openai-responses" | "anthropic" | "ollama", base_url, api_key_env,
discover, models).
A provider with discover = true is asked for its listing, which is kept for 24 hours
in $XDG_CACHE_HOME/melchior/models/; --refresh asks again whatever the cache says. A
successful listing, even an empty one, replaces the cached one; a failed request keeps
the last cached listing and names the provider on stderr and in 'failed'. A provider
with discover = false shows its configured models and is never asked.

--json prints one reply: {"ok": true, "family": 1, "n": N, "result": [model cards],
"refreshed": true|false, "failed": [provider ids]}; a card has provider, id, kind and
whatever the listing gave (display_name, context_window, created, ...).

Exit status: 0 when some provider's listing is current (fetched now, cached within
24 hours, or configured), failures or not; 1 when none is because every provider asked
failed (what is shown is old or nothing); 2 when the config file is wrong. See
docs/providers.md."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from typing import Any

EXIT_ALL_FAILED = 1
EXIT_CONFIG = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="ask every provider with discover = true now, bypassing the 24-hour cache",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON reply")


def run(ns: argparse.Namespace) -> int:
    import asyncio

    from melchior.providers.config import ConfigError, read_providers
    from melchior.providers.discovery import discover
    from melchior.wire import argv
    from melchior.wire.calls import ok, refused

    try:
        configs = read_providers()
    except ConfigError as exc:
        if ns.json:
            argv.emit(refused(f"melchior models: {exc}", code="bad-config"))
        print(f"melchior models: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    found = asyncio.run(discover(configs, refresh=ns.refresh))
    for name in found.failed:
        kept = found.origins.get(name) == "stale-cache"
        then = found.fetched_at.get(name)
        note = (
            f"; showing its listing from {_age(time.time() - then)} ago"
            if kept and then is not None
            else "; nothing cached to show"
        )
        print(f"melchior models: {found.reasons[name]}{note}", file=sys.stderr)
    if ns.json:
        reply = ok(found.cards)
        reply["refreshed"] = found.refreshed
        reply["failed"] = found.failed
        argv.emit(reply)
    else:
        _table(found.cards, found.origins, found.fetched_at)
        if not configs:
            print(
                "melchior models: no [providers.NAME] in the config file; see docs/providers.md",
                file=sys.stderr,
            )
    return EXIT_ALL_FAILED if found.all_failed else 0


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{int(seconds)} s"
    if seconds < 7200:
        return f"{int(seconds // 60)} min"
    if seconds < 172800:
        return f"{int(seconds // 3600)} h"
    return f"{int(seconds // 86400)} days"


def _clean(value: Any) -> str:
    """A listing's value made safe for a terminal: no control characters."""
    text = "-" if value is None else str(value)
    return "".join(c if c.isprintable() else "?" for c in text)[:80]


def _table(
    cards: list[dict[str, Any]], origins: Mapping[str, str], fetched: Mapping[str, float]
) -> None:
    now = time.time()
    rows = [("PROVIDER", "MODEL", "CONTEXT", "LISTED")]
    for card in cards:
        name = str(card.get("provider"))
        origin = origins.get(name, "")
        if origin == "static":
            listed = "config"
        elif name in fetched:
            listed = "now" if origin == "fetched" else f"{_age(now - fetched[name])} ago"
        else:
            listed = origin
        rows.append(
            (_clean(name), _clean(card.get("id")), _clean(card.get("context_window")), listed)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3])
